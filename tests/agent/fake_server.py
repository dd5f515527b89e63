"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for the runner's tests.

It is a real ``ThreadingHTTPServer`` speaking the JSON of ``POST /v1/chat/completions``
(``choices[0].message`` with ``content``, ``tool_calls``, ``reasoning_content``; ``usage``).
What it answers comes from a *policy*: a function of the request body returning a
:class:`Reply` or an :class:`HttpError`. :func:`by_turn` makes a policy from a list of replies
indexed by the number of assistant messages already in the request, so several episodes can
share one server (the policy holds no state of its own).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One assistant message: text, optional reasoning, tool calls ``(name, arguments)``.

    ``arguments`` may be a dict (sent as JSON) or a raw string (sent as it is, e.g. malformed).
    """

    content: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    prompt_tokens: int = 100
    completion_tokens: int = 20


@dataclass
class RawBody:
    """A 200 answer whose body is these bytes, as they are (garbage, invalid UTF-8, ...)."""

    body: bytes


@dataclass
class Hang:
    """No answer for ``seconds`` (the client times out first), then the connection closes."""

    seconds: float


@dataclass
class HttpError:
    """An HTTP error answer (status and an OpenAI-style error body)."""

    status: int
    message: str = "error"
    headers: dict[str, str] = field(default_factory=dict)


#: What a policy may answer.
Answer = Reply | HttpError | RawBody | Hang
Policy = Callable[[dict[str, Any]], Answer]


def by_turn(replies: list[Answer]) -> Policy:
    """A policy answering with ``replies[k]`` where k counts the request's assistant messages;
    past the end it repeats the last reply."""

    def policy(body: dict[str, Any]) -> Answer:
        k = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        return replies[min(k, len(replies) - 1)]

    return policy


class FakeServer:
    """The loopback server. Use as a context manager; ``base_url`` is the API root.

    Attributes:
        requests: every request body received, in order.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._counter = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with server._lock:
                    server.requests.append(body)
                    server._counter += 1
                    n = server._counter
                answer = server.policy(body)
                if isinstance(answer, Hang):
                    time.sleep(answer.seconds)
                    self.close_connection = True
                    return
                if isinstance(answer, RawBody):
                    self._send_bytes(200, answer.body, {})
                    return
                if isinstance(answer, HttpError):
                    self._send(
                        answer.status,
                        {"error": {"message": answer.message, "type": "server_error"}},
                        answer.headers,
                    )
                    return
                self._send(200, _completion(body, answer, n))

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers or {})

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _completion(body: dict[str, Any], reply: Reply, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(reply.calls)
        ]
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }
