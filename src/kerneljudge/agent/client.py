"""The model client: chat completions with tools over the ``openai`` package, with retries.

Importing this module needs the ``[agent]`` extra; without it the import fails with the one
line ``install kerneljudge[agent]`` (see :class:`MissingExtraError`).
"""

from __future__ import annotations

import json
import random
import re
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
    "clean_json",
    "clean_text",
]


class MissingExtraError(KernelJudgeError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, extra: str, package: str) -> None:
        self.extra = extra
        self.package = package
        super().__init__(f"the {package} package is missing: install kerneljudge[{extra}]")


try:
    import httpx
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
                too long, ...) or a transient one that outlived the retries; a body that is
                no chat completion (not JSON, no choices) is retried like a 5xx first.
        """
        cfg = self.config
        # Lone surrogates (from a model's malformed output) cannot be sent as UTF-8.
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": clean_json(messages),
            "tools": clean_json(tools),
        }
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
                raw = self._client.chat.completions.with_raw_response.create(**kwargs)
                body = raw.content
                return _completion(_payload(body), time.monotonic() - started, attempt)
            except openai.APIConnectionError as exc:  # also APITimeoutError
                if attempt > cfg.max_retries:
                    raise ServerUnreachable(cfg.base_url, attempt, _detail(exc)) from None
                self._sleep(self._backoff(attempt, None))
            except openai.APIStatusError as exc:
                if exc.status_code not in _RETRY_STATUS or attempt > cfg.max_retries:
                    raise ModelRequestError(exc.status_code, _detail(exc)) from None
                self._sleep(self._backoff(attempt, exc.response.headers.get("retry-after")))
            except (httpx.HTTPError, MalformedReply) as exc:
                # A body cut short or that is no chat completion: a proxy's or a server's
                # glitch, retried like a 5xx.
                if attempt > cfg.max_retries:
                    raise ModelRequestError(None, f"malformed response: {_detail(exc)}") from None
                self._sleep(self._backoff(attempt, None))

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


class MalformedReply(ValueError):
    """A 200 answer whose body is not a chat completion (not JSON, no ``choices``, ...)."""


#: Code points that cannot be encoded as UTF-8: lone surrogates.
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(value: str) -> str:
    """``value`` with every lone surrogate replaced by U+FFFD, so that it encodes as UTF-8."""
    return _SURROGATES.sub("\ufffd", value)


def clean_json(value: Any) -> Any:
    """A copy of a JSON-ready value whose strings (keys too) all encode as UTF-8."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_json(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def _payload(body: bytes) -> dict[str, Any]:
    """The JSON object of a response body. Bytes that are not UTF-8 become U+FFFD (the rest of
    the reply is kept).

    Raises:
        MalformedReply: not a JSON object.
    """
    text = body.decode("utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        head = text[:60].replace("\n", " ")
        raise MalformedReply(f"the body is not JSON ({type(exc).__name__}): {head!r}") from None
    if not isinstance(payload, dict):
        raise MalformedReply(f"the body is a JSON {type(payload).__name__}, not an object")
    return payload


def _text(value: Any) -> str:
    """A reply field as text ("" for null; other JSON as its JSON text)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return clean_text(value)
    return clean_text(json.dumps(value))


def _completion(payload: dict[str, Any], latency_s: float, attempts: int) -> Completion:
    """A :class:`Completion` of a response's JSON; fields of the wrong type are read leniently
    (a tool call without a name gets the name "", the environment answers it).

    Raises:
        MalformedReply: no ``choices[0].message`` object.
    """
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedReply("the response has no choices")
    choice = choices[0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise MalformedReply("the response's first choice has no message")
    reasoning, key = None, "reasoning_content"
    for candidate in ("reasoning_content", "reasoning"):
        value = msg.get(candidate)
        if isinstance(value, str) and value:
            reasoning, key = clean_text(value), candidate
            break
    calls = []
    raw_calls = msg.get("tool_calls")
    for tc in raw_calls if isinstance(raw_calls, list) else []:
        tc = tc if isinstance(tc, dict) else {}
        fn = tc.get("function")
        fn = fn if isinstance(fn, dict) else {}
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else None
        args = fn.get("arguments")
        # The arguments stay as sent (the environment reports what is wrong with them).
        arguments = args if isinstance(args, str) else ("" if args is None else json.dumps(args))
        calls.append(
            ToolCall(
                _text(fn.get("name")),
                arguments,
                clean_text(call_id or f"call_{uuid.uuid4().hex[:12]}"),
            )
        )
    usage = payload.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    counts = {}
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(k)
        counts[k] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return Completion(
        content=_text(msg.get("content")),
        reasoning=reasoning,
        reasoning_key=key,
        tool_calls=calls,
        finish_reason=_text(choice.get("finish_reason")),
        usage=counts,
        latency_s=latency_s,
        attempts=attempts,
    )
