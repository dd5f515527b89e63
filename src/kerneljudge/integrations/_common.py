"""What the integrations share: the missing-extra error and judge options as an EnvConfig."""

from __future__ import annotations

import dataclasses
from typing import Any

from kerneljudge.env import EnvConfig
from kerneljudge.errors import KernelJudgeError

__all__ = ["MissingExtraError", "env_config", "problem_list"]


class MissingExtraError(KernelJudgeError, ImportError):
    """An optional package is not installed; the message names the extra to install."""

    def __init__(self, extra: str, package: str) -> None:
        self.extra = extra
        self.package = package
        super().__init__(f"the {package} package is missing: install kerneljudge[{extra}]")


_TUPLES = ("baselines", "submit_shape_sets")


def env_config(**options: Any) -> EnvConfig:
    """An :class:`EnvConfig` from keyword options, as a command line or a config file gives them.

    Args:
        options: :class:`EnvConfig` field names and values. ``baselines`` and
            ``submit_shape_sets`` also take a comma-separated string (``"eager,compile"``);
            ``None`` leaves a field at its default.

    Raises:
        ValueError: an unknown option name, or a value :class:`EnvConfig` refuses.
    """
    names = {f.name for f in dataclasses.fields(EnvConfig)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(names))}"
        )
    kwargs = {k: v for k, v in options.items() if v is not None}
    for key in _TUPLES:
        value = kwargs.get(key)
        if isinstance(value, str):
            kwargs[key] = tuple(p.strip() for p in value.split(",") if p.strip())
        elif isinstance(value, list):
            kwargs[key] = tuple(value)
    return EnvConfig(**kwargs)


def problem_list(problems: str | list[str] | tuple[str, ...]) -> list[str]:
    """Problem names or paths from a list or a comma-separated string (order kept).

    Raises:
        ValueError: no problem given.
    """
    items = problems.split(",") if isinstance(problems, str) else list(problems)
    names = [str(p).strip() for p in items if str(p).strip()]
    if not names:
        raise ValueError("no problem given")
    return names
