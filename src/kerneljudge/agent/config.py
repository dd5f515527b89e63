"""The runner's configuration: which model server, how to sample, how to retry."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kerneljudge.errors import ConfigError
from kerneljudge.judge.config import check_integer, check_seconds

__all__ = ["RunnerConfig", "check_runner_numbers"]


@dataclass(frozen=True)
class RunnerConfig:
    """How the runner talks to an OpenAI-compatible chat-completions server.

    Attributes:
        model: the model name the server knows.
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: the bearer token (never written to transcripts; ``EMPTY`` for local servers).
        temperature, top_p: sampling (None: the server's default).
        max_tokens: completion token limit per reply, at least 1 (None: the server's default).
        request_timeout_s: limit of one request (seconds, above 0).
        max_retries: retries of a request after a transient error (connection failure,
            timeout, 408, 409, 429, 5xx), with exponential backoff (at least 0).
        backoff_s: the first retry's wait (seconds, at least 0); doubled on each retry, with
            jitter, capped at ``max_backoff_s``; a ``Retry-After`` header wins when present.
        max_backoff_s: the longest wait between retries (seconds, at least 0).
        reasoning_in_history: send the model's reasoning back in later requests (some servers
            want it, some reject it). It is always kept in the transcript.
        parallel_tool_calls: sent as ``parallel_tool_calls`` when not None.
        extra_body: extra JSON fields for every request (e.g. ``chat_template_kwargs``).

    Raises:
        ValueError: no model or no server URL; a :class:`~kerneljudge.errors.ConfigError`
            (a ValueError whose message names the field) for a number out of its range:
            ``temperature`` below 0, ``top_p`` not in (0, 1], ``max_tokens`` below 1,
            ``request_timeout_s`` not above 0, ``max_retries``, ``backoff_s`` or
            ``max_backoff_s`` below 0.
    """

    model: str
    base_url: str
    api_key: str = "EMPTY"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 5
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    reasoning_in_history: bool = False
    parallel_tool_calls: bool | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("a model name is needed (--model)")
        if not self.base_url:
            raise ValueError("a server URL is needed (--base-url)")
        check_runner_numbers({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    def public_dict(self) -> dict[str, Any]:
        """The configuration without the API key, for transcripts."""
        out = dataclasses.asdict(self)
        out.pop("api_key")
        return out


#: The checks of :class:`RunnerConfig`'s numeric fields (each raises ConfigError naming it).
_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "temperature": lambda n, v: _number(n, v, "of at least 0", lambda x: x >= 0),
    "top_p": lambda n, v: _number(n, v, "above 0 and at most 1", lambda x: 0 < x <= 1),
    "max_tokens": lambda n, v: _optional_integer(n, v, 1),
    "request_timeout_s": check_seconds,
    "max_retries": lambda n, v: check_integer(n, v, 0),
    "backoff_s": lambda n, v: check_seconds(n, v, zero=True),
    "max_backoff_s": lambda n, v: check_seconds(n, v, zero=True),
}


def _number(name: str, value: Any, what: str, ok: Callable[[Any], bool]) -> None:
    """None, or a number (not a bool, not NaN) for which ``ok`` holds."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
        raise ConfigError(name, f"{name} must be a number {what}, not {value!r}")


def _optional_integer(name: str, value: Any, low: int) -> None:
    if value is not None:
        check_integer(name, value, low)


def check_runner_numbers(values: Mapping[str, Any]) -> None:
    """Check the numeric fields of :class:`RunnerConfig` among ``values`` (field name to
    value; other keys are ignored), in the order of the class.

    Raises:
        ConfigError: the first field out of its range (see :class:`RunnerConfig`).
    """
    for name, check in _CHECKS.items():
        if name in values:
            check(name, values[name])
