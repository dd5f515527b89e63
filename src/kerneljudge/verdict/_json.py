"""The JSON form of the verdict's dataclasses: to plain data and back, guided by their type
hints (resolved in each dataclass's own module)."""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any

__all__ = ["from_jsonable", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def from_jsonable(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return from_jsonable(args[0], value) if len(args) == 1 else value
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: from_jsonable(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.name in value
        }
        return tp(**kwargs)
    if origin is tuple:
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(from_jsonable(items[0], v) for v in value)
        return tuple(from_jsonable(a, v) for a, v in zip(items, value))
    if origin is dict:
        kv = typing.get_args(tp)
        if len(kv) == 2:
            return {k: from_jsonable(kv[1], v) for k, v in value.items()}
        return dict(value)
    return value
