"""Tools: a Python function whose docstring is what the model reads.

A tool's function returns what the call produced: the environment's tools return an
:class:`~kerneljudge.env.observations.Observation`.

:func:`tool` turns a function into a :class:`Tool`: its name is the function's name, its
description the docstring up to the ``Args:`` section, and its JSON-schema parameters come from
the signature (types, defaults) and the ``Args:`` lines (descriptions). There is one place to edit
a tool's wording and no way for the schema to drift from the code.

Arguments the model gets wrong (bad JSON, a missing or unknown argument, a wrong type) and
failures a tool reports on purpose raise :class:`ToolError`; the environment turns it into an
observation and the episode goes on.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["MAX_ARGUMENT_CHARS", "Tool", "ToolError", "parse_docstring", "tool"]

#: What a tool's function returns.
R = TypeVar("R")

#: The longest arguments text a tool decodes (characters); longer ones are a tool error.
MAX_ARGUMENT_CHARS = 4 * 1024 * 1024

_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"^(Args|Arguments|Returns|Raises|Yields|Examples?|Notes?):\s*$")


class ToolError(Exception):
    """A failure the model should read and react to (bad arguments, empty code, ...).

    Attributes:
        tool: the tool's name ("" when the name itself was unknown).
        message: what went wrong, written for the model.
        code: the code the call was given, when the tool had read it before failing (None
            otherwise).
    """

    def __init__(self, tool: str, message: str, code: str | None = None) -> None:
        self.tool = tool
        self.message = message
        self.code = code
        super().__init__(f"{tool}: {message}" if tool else message)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its ``Args:`` entries.

    Args:
        doc: the docstring (as :func:`inspect.getdoc` returns it: dedented).

    Returns:
        ``(description, {arg name: description})``. The description is every line outside the
        ``Args:`` section with its indentation kept; an argument's continuation lines are
        joined with spaces.
    """
    description: list[str] = []
    args: dict[str, str] = {}
    section = ""
    current = ""
    for line in doc.splitlines():
        match = _SECTION.match(line.strip()) if not line.startswith(" ") else None
        if match:
            section = match.group(1)
            if section not in ("Args", "Arguments"):
                description.append(line)
            continue
        if section in ("Args", "Arguments"):
            stripped = line.strip()
            entry = re.match(r"^(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", stripped)
            indent = len(line) - len(line.lstrip())
            if entry and indent <= 4:
                current = entry.group(1)
                args[current] = entry.group(2).strip()
            elif stripped and current:
                args[current] = f"{args[current]} {stripped}".strip()
            elif not stripped:
                current = ""
            continue
        description.append(line)
    return "\n".join(description).strip(), args


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return _json_type(options[0], where)
        return {"anyOf": [_json_type(a, where) for a in options]}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (list, tuple):
        (item,) = typing.get_args(annotation)[:1] or (str,)
        return {"type": "array", "items": _json_type(item, where)}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    raise TypeError(f"{where}: no JSON-schema type for annotation {annotation!r}")


def _invalid_unicode(arguments: dict[Any, Any]) -> str:
    """What in decoded arguments holds a lone surrogate (``"argument 'x'"``), "" when nothing.
    Such text cannot be written to a file or sent back as UTF-8."""
    for key, value in arguments.items():
        if _has_surrogate(key):
            return "an argument's name"
        if _has_surrogate(value):
            return f"argument {key!r}"
    return ""


def _has_surrogate(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` (text, or dicts and lists of it, 50 levels deep at most) holds a lone
    surrogate."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if depth > 50:
        return False
    if isinstance(value, dict):
        return any(
            _has_surrogate(k, depth + 1) or _has_surrogate(v, depth + 1) for k, v in value.items()
        )
    if isinstance(value, list):
        return any(_has_surrogate(v, depth + 1) for v in value)
    return False


def _check_type(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_check_type(value, a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (list, tuple):
        return isinstance(value, list)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


@dataclass(frozen=True)
class Tool(Generic[R]):
    """One agent-facing tool.

    Attributes:
        name: the function name the model calls.
        description: the docstring without its ``Args:`` section.
        parameters: the JSON schema of the arguments (an ``object`` schema).
        fn: the function; it returns what the call produced (the environment's tools: an
            :class:`~kerneljudge.env.observations.Observation`).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., R]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling entry: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def parse_arguments(self, arguments: str | dict[str, Any] | None) -> dict[str, Any]:
        """Decode and validate the model's arguments against the signature.

        Args:
            arguments: the JSON text the model sent, or an already decoded dict.

        Returns:
            Keyword arguments for :attr:`fn`.

        Raises:
            ToolError: longer than :data:`MAX_ARGUMENT_CHARS`, not JSON, not an object, text
                that is not valid Unicode (lone surrogates), unknown or missing arguments,
                wrong types.
        """
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = {}
        if isinstance(arguments, str):
            if len(arguments) > MAX_ARGUMENT_CHARS:
                raise ToolError(
                    self.name,
                    f"the arguments are {len(arguments):,} characters long; the limit is "
                    f"{MAX_ARGUMENT_CHARS:,}",
                )
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ToolError(
                    self.name,
                    f"the arguments are not valid JSON ({exc.msg} at line {exc.lineno} column "
                    f"{exc.colno}); send a JSON object such as {self._example()}",
                ) from None
            except RecursionError:
                raise ToolError(
                    self.name,
                    f"the arguments nest too deeply to decode; send a flat JSON object such "
                    f"as {self._example()}",
                ) from None
        if not isinstance(arguments, dict):
            raise ToolError(
                self.name, f"the arguments must be a JSON object such as {self._example()}"
            )
        bad = _invalid_unicode(arguments)
        if bad:
            raise ToolError(
                self.name,
                f"{bad} contains a character that is not valid Unicode text (a lone surrogate); "
                f"send the code as plain UTF-8 text",
            )
        params = inspect.signature(self.fn).parameters
        hints = typing.get_type_hints(self.fn)
        unknown = sorted(set(arguments) - set(params))
        if unknown:
            raise ToolError(
                self.name,
                f"unknown argument {', '.join(map(repr, unknown))}; "
                f"{self.name} takes {', '.join(params) or 'no arguments'}",
            )
        missing = [
            n
            for n, p in params.items()
            if p.default is inspect.Parameter.empty and n not in arguments
        ]
        if missing:
            names = ", ".join(map(repr, missing))
            raise ToolError(self.name, f"missing required argument {names}")
        for name, value in arguments.items():
            if name in hints and not _check_type(value, hints[name]):
                want = self.parameters["properties"][name].get("type", "a valid value")
                raise ToolError(
                    self.name, f"argument {name!r} must be {want}, got {type(value).__name__}"
                )
        return dict(arguments)

    def __call__(self, arguments: str | dict[str, Any] | None) -> R:
        """Validate ``arguments`` and run the tool; returns what :attr:`fn` returns.

        Raises:
            ToolError: bad arguments, or the tool's own report of a failure.
        """
        return self.fn(**self.parse_arguments(arguments))

    def _example(self) -> str:
        props = self.parameters.get("properties", {})
        return json.dumps({k: "..." for k in props})


def tool(fn: Callable[..., R], *, name: str | None = None) -> Tool[R]:
    """Make a :class:`Tool` of ``fn`` from its signature and docstring.

    Args:
        fn: a function with annotated parameters (str, int, float, bool, Literal, list, or
            Optional of these) returning the call's result, and a docstring with an
            ``Args:`` entry for every parameter.
        name: the tool's name (default: ``fn.__name__``).

    Returns:
        The tool.

    Raises:
        TypeError: a parameter without annotation, of an unsupported type, or without an
            ``Args:`` entry; a function without a docstring.
    """
    tool_name = name or fn.__name__
    doc = inspect.getdoc(fn)
    if not doc:
        raise TypeError(f"tool {tool_name}: the function needs a docstring (the model reads it)")
    description, arg_docs = parse_docstring(doc)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname not in hints:
            raise TypeError(f"tool {tool_name}: parameter {pname!r} has no type annotation")
        if pname not in arg_docs:
            raise TypeError(f"tool {tool_name}: parameter {pname!r} has no Args: entry")
        prop = _json_type(hints[pname], f"tool {tool_name}, parameter {pname!r}")
        prop["description"] = arg_docs[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        elif param.default is not None:
            prop["default"] = param.default
        properties[pname] = prop
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return Tool(name=tool_name, description=description, parameters=parameters, fn=fn)
