"""The runner's configuration: which model server, how to sample, how to retry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunnerConfig"]


@dataclass(frozen=True)
class RunnerConfig:
    """How the runner talks to an OpenAI-compatible chat-completions server.

    Attributes:
        model: the model name the server knows.
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: the bearer token (never written to transcripts; ``EMPTY`` for local servers).
        temperature, top_p: sampling (None: the server's default).
        max_tokens: completion token limit per reply (None: the server's default).
        request_timeout_s: limit of one request (seconds).
        max_retries: retries of a request after a transient error (connection failure,
            timeout, 408, 409, 429, 5xx), with exponential backoff.
        backoff_s: the first retry's wait (seconds); doubled on each retry, with jitter,
            capped at ``max_backoff_s``; a ``Retry-After`` header wins when present.
        max_backoff_s: the longest wait between retries (seconds).
        reasoning_in_history: send the model's reasoning back in later requests (some servers
            want it, some reject it). It is always kept in the transcript.
        parallel_tool_calls: sent as ``parallel_tool_calls`` when not None.
        extra_body: extra JSON fields for every request (e.g. ``chat_template_kwargs``).
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
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, not {self.max_retries}")

    def public_dict(self) -> dict[str, Any]:
        """The configuration without the API key, for transcripts."""
        out = dataclasses.asdict(self)
        out.pop("api_key")
        return out
