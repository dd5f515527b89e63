"""Clients of the judge service (httpx): :class:`JudgeClient` (blocking) and
:class:`AsyncJudgeClient` (asyncio), with the same methods.

Errors are one-line exceptions: :class:`QueueFullError` (429; ``retry_after_s`` from the
``Retry-After`` header), :class:`AuthError` (401), :class:`InvalidJobError` (413, 422),
:class:`NotFoundError` (404), :class:`ConflictError` (409), :class:`ServiceError` (anything
else, and a service that cannot be reached). A job that got no verdict raises its
:class:`~kerneljudge.executors.base.JobError` from :meth:`JudgeClient.result`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the judge service's client needs httpx: install kerneljudge[serve]") from exc

from kerneljudge.errors import KernelJudgeError
from kerneljudge.executors.base import Job, JobError
from kerneljudge.verdict import Verdict

__all__ = [
    "AsyncJudgeClient",
    "AuthError",
    "ConflictError",
    "InvalidJobError",
    "JudgeClient",
    "NotFoundError",
    "QueueFullError",
    "ServiceError",
]


class ServiceError(KernelJudgeError):
    """The service answered with an error, or could not be reached (one line).

    Attributes:
        status: the HTTP status (0: no answer).
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AuthError(ServiceError):
    """401: no API token, or the wrong one."""


class InvalidJobError(ServiceError):
    """422 or 413: the service refused the job as sent (the message says why)."""


class NotFoundError(ServiceError):
    """404: no such job."""


class ConflictError(ServiceError):
    """409: the job id names another job, or a cancel came too late."""


class QueueFullError(ServiceError):
    """429: no room for the job now; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(f"{message} (retry after {retry_after_s:g} s)", 429)
        self.retry_after_s = retry_after_s


_ERRORS: dict[int, type[ServiceError]] = {
    401: AuthError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidJobError,
    422: InvalidJobError,
}


def _check(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a 2xx answer; otherwise the error it stands for, raised."""
    try:
        body = response.json()
    except (json.JSONDecodeError, ValueError):
        body = {"detail": response.text[:200]}
    if response.is_success:
        return body if isinstance(body, dict) else {"value": body}
    detail = body.get("detail") if isinstance(body, dict) else None
    message = " ".join(str(detail or response.reason_phrase).split())
    message = f"{response.status_code}: {message}"
    if response.status_code == 429:
        try:
            retry = float(response.headers.get("retry-after", "1"))
        except ValueError:
            retry = 1.0
        raise QueueFullError(message, retry)
    raise _ERRORS.get(response.status_code, ServiceError)(message, response.status_code)


def _job_dict(job: Job | dict[str, Any]) -> dict[str, Any]:
    return job.to_dict() if isinstance(job, Job) else job


def _verdict(body: dict[str, Any], job_id: str, wait: float) -> Verdict:
    state = body.get("state")
    if state == "done" and body.get("verdict") is not None:
        return Verdict.from_dict(body["verdict"])
    if state in ("failed", "cancelled"):
        raise JobError(str(body.get("error") or state), kind=str(body.get("error_kind") or state))
    raise TimeoutError(f"job {job_id} is still {state} after {wait:g} s")


def _q(job_id: str) -> str:
    """``job_id`` as one path segment: percent-encoded, and the dot segments ``.`` and ``..``
    (which a URL would resolve away) as ``%2E``s."""
    return "%2E" * len(job_id) if job_id in (".", "..") else quote(job_id, safe="")


def _http_client(cls: type[Any], base_url: str, token: str | None, timeout_s: float) -> Any:
    """``cls`` (httpx's client or async client) for ``base_url``, or a one-line ServiceError
    for an address it cannot use or a token an HTTP header cannot carry (printable ASCII)."""
    if token and not (token.isascii() and token.isprintable()):
        raise ServiceError("the API token must be printable ASCII (an HTTP header carries it)")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return cls(base_url=base_url, headers=headers, timeout=timeout_s)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise ServiceError(f"not a service address: {base_url!r} ({exc})") from None


def _unreachable(base_url: str, exc: Exception) -> ServiceError:
    return ServiceError(f"cannot reach the judge service at {base_url}: {type(exc).__name__}")


class JudgeClient:
    """A blocking client of the judge service at ``base_url`` (``http://host:port``).

    Args:
        base_url: the service's address.
        token: the API token (sent as ``Authorization: Bearer``).
        timeout_s: seconds for one request, beyond any ``wait``.

    Raises:
        ServiceError: ``base_url`` is not an address httpx can use, or ``token`` is not
            printable ASCII.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = _http_client(httpx.Client, self.base_url, token, timeout_s)

    def _call(self, method: str, path: str, wait: float = 0.0, **kw: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, timeout=self.timeout_s + wait, **kw)
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return _check(response)

    def submit(self, job: Job | dict[str, Any]) -> dict[str, Any]:
        """Queue ``job``; its status (``created`` False: the job id was known)."""
        return self._call("POST", "/v1/jobs", json=_job_dict(job))

    def submit_batch(self, jobs: list[Job] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Queue ``jobs``, all or none; their statuses, in order."""
        body = self._call("POST", "/v1/batches", json={"jobs": [_job_dict(j) for j in jobs]})
        return list(body["jobs"])

    def status(self, job_id: str) -> dict[str, Any]:
        """The job's status (``state``: queued, running, done, failed, cancelled)."""
        return self._call("GET", f"/v1/jobs/{_q(job_id)}")

    def result(self, job_id: str, wait: float = 0.0) -> Verdict:
        """The job's verdict, waiting up to ``wait`` seconds (asked in pieces of at most a
        minute).

        Raises:
            JobError: the job got no verdict (failed or cancelled).
            TimeoutError: not finished after ``wait`` seconds.
        """
        import time

        deadline = time.monotonic() + wait
        while True:
            left = max(0.0, deadline - time.monotonic())
            piece = min(left, 60.0)
            body = self._call("GET", f"/v1/jobs/{_q(job_id)}/result", piece, params={"wait": piece})
            if body.get("state") in ("done", "failed", "cancelled") or left <= piece:
                return _verdict(body, job_id, wait)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job that has not started (ConflictError: too late)."""
        return self._call("DELETE", f"/v1/jobs/{_q(job_id)}")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def metrics(self) -> dict[str, Any]:
        return self._call("GET", "/v1/metrics")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> JudgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncJudgeClient:
    """The asyncio form of :class:`JudgeClient` (same arguments, methods are coroutines)."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = _http_client(httpx.AsyncClient, self.base_url, token, timeout_s)

    async def _call(self, method: str, path: str, wait: float = 0.0, **kw: Any) -> dict[str, Any]:
        try:
            response = await self._http.request(method, path, timeout=self.timeout_s + wait, **kw)
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from None
        return _check(response)

    async def submit(self, job: Job | dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/v1/jobs", json=_job_dict(job))

    async def submit_batch(self, jobs: list[Job] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = await self._call("POST", "/v1/batches", json={"jobs": [_job_dict(j) for j in jobs]})
        return list(body["jobs"])

    async def status(self, job_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/jobs/{_q(job_id)}")

    async def result(self, job_id: str, wait: float = 0.0) -> Verdict:
        """See :meth:`JudgeClient.result`."""
        import time

        deadline = time.monotonic() + wait
        while True:
            left = max(0.0, deadline - time.monotonic())
            piece = min(left, 60.0)
            body = await self._call(
                "GET", f"/v1/jobs/{_q(job_id)}/result", piece, params={"wait": piece}
            )
            if body.get("state") in ("done", "failed", "cancelled") or left <= piece:
                return _verdict(body, job_id, wait)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/jobs/{_q(job_id)}")

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/health")

    async def metrics(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/metrics")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncJudgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
