"""The model client: chat completions with tools over the ``openai`` package, with retries.

Importing this module needs the ``[agent]`` extra; without it the import fails with the one
line ``install kerneljudge[agent]`` (see :class:`MissingExtraError`).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kerneljudge.agent.config import RunnerConfig
from kerneljudge.env import ToolCall
from kerneljudge.errors import KernelJudgeError

__all__ = [
    "Completion",
    "MissingExtraError",
    "ModelClient",
    "ModelRequestError",
    "ServerUnreachable",
]


class MissingExtraError(KernelJudgeError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, extra: str, package: str) -> None:
        self.extra = extra
        self.package = package
        super().__init__(f"the {package} package is missing: install kerneljudge[{extra}]")


try:
    import openai
except ImportError:
    raise MissingExtraError("agent", "openai") from None


class ServerUnreachable(KernelJudgeError):
    """The model server could not be reached (connection refused, DNS, timeouts) after retries.

    Attributes:
        base_url: the server.
        attempts: requests tried.
        detail: the last error's message.
    """

    def __init__(self, base_url: str, attempts: int, detail: str) -> None:
        self.base_url = base_url
        self.attempts = attempts
        self.detail = detail
        noun = "attempt" if attempts == 1 else "attempts"
        super().__init__(
            f"cannot reach the model server at {base_url} ({attempts} {noun}): {detail}"
        )


class ModelRequestError(KernelJudgeError):
    """The server answered a request with an error that retrying does not fix (e.g. 400).

    Attributes:
        status: the HTTP status (None when there was none).
        detail: the server's message.
    """

    def __init__(self, status: int | None, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"the model server refused the request ({status}): {detail}")


_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Completion:
    """One model reply.

    Attributes:
        content: the reply's text ("" when none).
        reasoning: the reasoning text when the server sent one (``reasoning_content`` or
            ``reasoning``), else None.
        reasoning_key: which of the two fields carried it.
        tool_calls: the calls, with ids (generated when the server sent none).
        finish_reason: as the server gave it.
        usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` (zeros when absent).
        latency_s: wall time of the successful request (seconds).
        attempts: requests made (1 without retries).
    """

    content: str
    reasoning: str | None
    reasoning_key: str
    tool_calls: list[ToolCall]
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    latency_s: float = 0.0
    attempts: int = 1

    def history_message(self, with_reasoning: bool) -> dict[str, Any]:
        """The assistant message to send back in the next request."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if with_reasoning and self.reasoning:
            msg[self.reasoning_key] = self.reasoning
        return msg

    def to_record(self) -> dict[str, Any]:
        """The transcript's fields for this reply."""
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls
            ],
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "latency_s": round(self.latency_s, 3),
            "attempts": self.attempts,
        }


class ModelClient:
    """Sends chat-completion requests with the episode's tools.

    Args:
        config: the server and sampling settings.
        sleep: the function that waits between retries (tests pass a fake).
    """

    def __init__(self, config: RunnerConfig, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self._sleep = sleep
        self._client = openai.OpenAI(
            base_url=config.base_url,
            api_key=config.api_key or "EMPTY",
            timeout=config.request_timeout_s,
            max_retries=0,
        )

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        """One reply of the model to ``messages``, retrying transient errors with backoff.

        Raises:
            ServerUnreachable: no connection after ``max_retries`` retries.
            ModelRequestError: a non-transient error (bad request, authentication, context
                too long, ...) or a transient one that outlived the retries.
        """
        cfg = self.config
        kwargs: dict[str, Any] = {"model": cfg.model, "messages": messages, "tools": tools}
        for key in ("temperature", "top_p", "max_tokens", "parallel_tool_calls"):
            if getattr(cfg, key) is not None:
                kwargs[key] = getattr(cfg, key)
        if cfg.extra_body:
            kwargs["extra_body"] = dict(cfg.extra_body)
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                response = self._client.chat.completions.create(**kwargs)
                return _completion(response, time.monotonic() - started, attempt)
            except openai.APIConnectionError as exc:  # also APITimeoutError
                if attempt > cfg.max_retries:
                    raise ServerUnreachable(cfg.base_url, attempt, _detail(exc)) from None
                self._sleep(self._backoff(attempt, None))
            except openai.APIStatusError as exc:
                if exc.status_code not in _RETRY_STATUS or attempt > cfg.max_retries:
                    raise ModelRequestError(exc.status_code, _detail(exc)) from None
                self._sleep(self._backoff(attempt, exc.response.headers.get("retry-after")))
            except openai.APIResponseValidationError as exc:
                raise ModelRequestError(None, f"malformed response: {_detail(exc)}") from None

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(self.config.max_backoff_s, max(0.0, float(retry_after)))
            except ValueError:
                pass
        base = self.config.backoff_s * 2 ** (attempt - 1)
        return min(self.config.max_backoff_s, base) * (0.5 + random.random() / 2)


def _detail(exc: Exception) -> str:
    text = str(getattr(exc, "message", "") or exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text} ({type(cause).__name__}: {cause})"
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _completion(response: Any, latency_s: float, attempts: int) -> Completion:
    if not getattr(response, "choices", None):
        raise ModelRequestError(None, "the response has no choices")
    choice = response.choices[0]
    msg = choice.message
    extra = dict(getattr(msg, "model_extra", None) or {})
    reasoning, key = None, "reasoning_content"
    for candidate in ("reasoning_content", "reasoning"):
        value = extra.get(candidate, getattr(msg, candidate, None))
        if isinstance(value, str) and value:
            reasoning, key = value, candidate
            break
    calls = []
    for tc in msg.tool_calls or []:
        fn = getattr(tc, "function", None)
        if fn is None:
            continue
        call_id = tc.id or f"call_{uuid.uuid4().hex[:12]}"
        calls.append(ToolCall(str(fn.name or ""), fn.arguments or "", call_id))
    usage = getattr(response, "usage", None)
    counts = {
        k: int(getattr(usage, k, 0) or 0)
        for k in ("prompt_tokens", "completion_tokens", "total_tokens")
    }
    return Completion(
        content=msg.content or "",
        reasoning=reasoning,
        reasoning_key=key,
        tool_calls=calls,
        finish_reason=str(choice.finish_reason or ""),
        usage=counts,
        latency_s=latency_s,
        attempts=attempts,
    )
