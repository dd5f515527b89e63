"""The HTTP face of the service (FastAPI): versioned endpoints under ``/v1``.

Every error answer is ``{"detail": "<one line>"}``: 401 (no or wrong token), 404 (no such
job, or one deleted by retention: "expired"), 409 (a job id that names another job; a cancel
too late), 413 (body too large), 422 (a bad job, a bad ``X-Client-Id``), 429 (no room; with
``Retry-After`` in seconds).

Clients: with a token, a request's client is its token; without one (loopback only), the name
in its ``X-Client-Id`` header (default ``anonymous``). Job ids are per client: a client sees,
waits for and cancels its own jobs only (another's id is 404, as an unknown one), and its ids
(idempotency keys) never meet another client's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, create_model
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kerneljudge.service._schema import DEFAULT_CLIENT
from kerneljudge.service.core import JudgeService
from kerneljudge.service.store import SCHEMA_VERSION, JobConflict, JobRecord, QueueFull

__all__ = ["create_app"]

_JOB_ID = Path(min_length=1, max_length=128, description="The job's id.")
#: A client's own name (``X-Client-Id``, without a token).
_CLIENT_NAME = re.compile(r"[A-Za-z0-9._:@-]{1,64}")


class JobIn(BaseModel):
    """One job (see ``kerneljudge.executors.base.Job``). ``options`` are ``JudgeOptions``
    fields; ``cache_dir`` is refused."""

    problem: str = Field(description="A bundled problem name or a file under --problems-dir.")
    source: str = Field(description="The candidate's source (a ModelNew module).")
    options: dict[str, Any] | None = Field(default=None, description="JudgeOptions fields.")
    job_id: str | None = Field(default=None, description="Idempotency key (default: random).")
    name: str | None = Field(default=None, description="The candidate's file name.")


class BatchIn(BaseModel):
    jobs: list[JobIn]


def _batch_model(max_batch: int) -> type[BatchIn]:
    """:class:`BatchIn` with at most ``max_batch`` jobs: pydantic refuses an oversized batch
    on its length instead of validating every job of it on the event loop first."""
    jobs = Field(max_length=max_batch)
    return create_model("BatchIn", __base__=BatchIn, jobs=(list[JobIn], jobs))


class JobStatus(BaseModel):
    job_id: str
    state: str = Field(description="queued, running, done, failed or cancelled.")
    problem: str
    source_sha256: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    error_kind: str | None
    error: str | None
    created: bool | None = Field(default=None, description="On submit: new (not a repeat).")


class JobResult(JobStatus):
    verdict: dict[str, Any] | None = Field(description="The verdict (state done).")


class BatchOut(BaseModel):
    jobs: list[JobStatus]


class CancelOut(BaseModel):
    job_id: str
    cancelled: bool
    state: str


class ErrorOut(BaseModel):
    detail: str = Field(description="What went wrong, one line.")


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers an operation may give, documented with their one-line body."""
    text = {
        401: "No or wrong API token.",
        404: "No such job of this client, or expired (deleted by retention).",
        409: "The job id names another job, or too late to cancel.",
        413: "Request body too large.",
        422: "Invalid request or job.",
        429: "No room in the queue; see Retry-After.",
    }
    return {c: {"model": ErrorOut, "description": text[c]} for c in (401, 413, 422, *codes)}


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_json(send, 413, f"request body larger than {self.limit} bytes")
                return
        seen = 0
        too_large = answered = False
        message_413 = f"request body larger than {self.limit} bytes"

        async def limited() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    too_large = True
                    raise _TooLarge
            return message

        async def guarded(message: Message) -> None:
            # The app may turn the interrupted read into an answer of its own: say 413.
            nonlocal answered
            if too_large:
                if not answered and message["type"] == "http.response.start":
                    answered = True
                    await _send_json(send, 413, message_413)
                return
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, guarded)
        except _TooLarge:
            if not answered:
                answered = True
                await _send_json(send, 413, message_413)


class _TooLarge(Exception):
    pass


async def _send_json(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _status(record: JobRecord, created: bool | None = None) -> dict[str, Any]:
    out = record.status()
    if created is not None:
        out["created"] = created
    return out


def create_app(service: JudgeService, token: str | None = None) -> FastAPI:
    """The FastAPI app over ``service``; with ``token`` every endpoint but ``/v1/health`` and
    the OpenAPI document needs ``Authorization: Bearer <token>`` (compared in constant time).
    The app neither starts nor closes ``service``."""
    app = FastAPI(
        title="kerneljudge",
        version=str(SCHEMA_VERSION),
        description="Judge kernel candidates: submit jobs, read verdicts.",
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(BodyLimit, limit=service.limits.max_body_bytes)
    expected = hashlib.sha256(token.encode()).digest() if token else None

    def client_of(request: Request) -> str:
        """The client: ``token:<its hash>`` (with a token; ``X-Client-Id`` is not read), else
        ``name:<X-Client-Id>`` (default ``anonymous``; 422 when not 1 to 64 of
        ``A-Z a-z 0-9 . _ : @ -``)."""
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if expected is not None:
            digest = hashlib.sha256(given.strip().encode()).digest()
            if scheme.lower() != "bearer" or not hmac.compare_digest(digest, expected):
                raise HTTPException(
                    401, "missing or wrong API token", headers={"WWW-Authenticate": "Bearer"}
                )
            return "token:" + digest.hex()[:16]
        name = request.headers.get("x-client-id")
        if name is None:
            return DEFAULT_CLIENT
        if not _CLIENT_NAME.fullmatch(name):
            raise HTTPException(422, "X-Client-Id is 1 to 64 of A-Z a-z 0-9 . _ : @ -")
        return "name:" + name

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if not errors:
            detail = "invalid request"
        elif first.get("type") == "json_invalid":
            detail = f"request body is not valid JSON: {first.get('msg', '')}"
        elif first.get("type") == "too_long" and where == "jobs":
            detail = f"a batch holds at most {service.limits.max_batch} jobs"
        else:
            detail = f"{where or 'request'}: {first.get('msg', 'invalid')}"
        return JSONResponse({"detail": _one_line(detail)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # A body that is not JSON (FastAPI says 400) is bad input like any other: 422.
        status = 422 if exc.status_code == 400 else exc.status_code
        detail = "request body is not valid JSON" if exc.status_code == 400 else exc.detail
        return JSONResponse(
            {"detail": _one_line(str(detail))}, status_code=status, headers=exc.headers
        )

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse(
            {"detail": _one_line(str(exc))},
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(JobConflict)
    async def _conflict(request: Request, exc: JobConflict) -> JSONResponse:
        return JSONResponse({"detail": _one_line(str(exc))}, status_code=409)

    def submit(items: list[dict[str, Any]], client: str) -> list[dict[str, Any]]:
        try:
            out = service.submit(items, client)
        except ValueError as exc:
            raise HTTPException(422, _one_line(str(exc))) from None
        return [_status(record, created) for record, created in out]

    def raw(item: JobIn) -> dict[str, Any]:
        out: dict[str, Any] = {"problem": item.problem, "source": item.source}
        out["options"] = item.options or {}
        out.update(
            {k: v for k, v in (("job_id", item.job_id), ("name", item.name)) if v is not None}
        )
        return out

    @app.post(
        "/v1/jobs",
        status_code=202,
        response_model=JobStatus,
        responses=_errors(409, 429),
        tags=["jobs"],
    )
    def submit_job(job: JobIn, client: str = Depends(client_of)) -> dict[str, Any]:
        """Queue one job (recorded on disk before this answers). A job_id seen before answers
        with that job (``created: false``)."""
        return submit([raw(job)], client)[0]

    def submit_batch(batch: BatchIn, client: str = Depends(client_of)) -> dict[str, Any]:
        """Queue several jobs, all or none, in order."""
        if not batch.jobs:
            raise HTTPException(422, "a batch holds at least one job")
        if len(batch.jobs) > service.limits.max_batch:
            raise HTTPException(422, f"a batch holds at most {service.limits.max_batch} jobs")
        return {"jobs": submit([raw(j) for j in batch.jobs], client)}

    # The body's model carries this service's bound (annotations are strings in this module).
    submit_batch.__annotations__["batch"] = _batch_model(service.limits.max_batch)
    app.post(
        "/v1/batches",
        status_code=202,
        response_model=BatchOut,
        responses=_errors(409, 429),
        tags=["jobs"],
    )(submit_batch)

    def record_of(job_id: str, client: str) -> JobRecord:
        record = service.store.get(job_id, client)
        if record is not None:
            return record
        deleted_at = service.store.expired(job_id, client)
        if deleted_at is not None:
            kept_h = service.limits.retention_s / 3600
            raise HTTPException(
                404,
                f"job {job_id[:128]!r} expired: deleted at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(deleted_at))} "
                f"(results are kept {kept_h:g} h after they finish)",
            )
        raise HTTPException(404, f"no job {job_id[:128]!r}")

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_errors(404), tags=["jobs"])
    def job_status(job_id: str = _JOB_ID, client: str = Depends(client_of)) -> dict[str, Any]:
        """The job's state."""
        return _status(record_of(job_id, client))

    @app.get(
        "/v1/jobs/{job_id}/result",
        response_model=JobResult,
        responses={
            202: {"model": JobResult, "description": "Not finished yet."},
            **_errors(404),
        },
        tags=["jobs"],
    )
    async def job_result(
        job_id: str = _JOB_ID,
        wait: float = Query(0.0, ge=0.0, le=service.limits.max_wait_s, allow_inf_nan=False),
        client: str = Depends(client_of),
    ) -> JSONResponse:
        """The job's verdict (200 once it is finished: ``verdict`` for state ``done``, else
        ``error``; the result then counts as fetched); 202 with its state while it is not
        finished after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        # The store's reads wait for its lock (held over fsync'd writes): off the event loop.
        record = await run_in_threadpool(record_of, job_id, client)
        delay = 0.05
        # A stopping service answers at once: a wait does not hold its shutdown.
        while not record.finished and time.monotonic() < deadline and not service.stopping:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(0.5, delay * 1.5)
            record = await run_in_threadpool(record_of, job_id, client)
        if record.finished and record.fetched_at is None:
            await run_in_threadpool(service.store.mark_fetched, record.seq)
        out = _status(record)
        out["verdict"] = json.loads(record.verdict_json) if record.verdict_json else None
        return JSONResponse(out, status_code=200 if record.finished else 202)

    @app.delete(
        "/v1/jobs/{job_id}",
        response_model=CancelOut,
        responses=_errors(404, 409),
        tags=["jobs"],
    )
    def cancel_job(job_id: str = _JOB_ID, client: str = Depends(client_of)) -> dict[str, Any]:
        """Cancel a job that has not started (it then counts as fetched); 409 when it has
        started or finished."""
        record_of(job_id, client)
        cancelled = service.cancel(job_id, client)
        record = record_of(job_id, client)
        state = record.state
        if not cancelled and state != "cancelled":
            raise HTTPException(409, f"job {job_id} is {state}: too late to cancel")
        if state == "cancelled":  # the client knows how its job ended: its result is fetched
            service.store.mark_fetched(record.seq)
        return {"job_id": job_id, "cancelled": cancelled, "state": state}

    @app.get("/v1/health", responses=_errors(), tags=["service"])
    def health() -> dict[str, Any]:
        """Liveness: the service answers and its database reads."""
        counts = service.store.counts()
        return {
            "status": "ok",
            "schema_version": SCHEMA_VERSION,
            "queue_depth": counts["queued"],
            "dispatching": service.executor is not None,
        }

    @app.get("/v1/metrics", responses=_errors(), tags=["service"])
    def metrics(client: str = Depends(client_of)) -> dict[str, Any]:
        """Queue depth, jobs per state, per-device busy share, verdicts per second."""
        return service.metrics()

    return app
