"""The service's engine, without HTTP: admission (problem and option checks, limits), the
dispatcher thread that hands queued jobs to an :class:`~kerneljudge.executors.base.Executor`,
and the result writes.

The dispatcher takes jobs from the store oldest first, at most ``max_in_flight`` handed to the
executor at a time, and writes each job's end state when its future completes (a verdict:
``done``; a :class:`JobError`: ``failed``, or ``cancelled`` for kind ``cancelled``). The
executor knows a job by its :attr:`~kerneljudge.service.store.JobRecord.run_id`, unique across
clients (job ids are per client).

The retention thread applies :meth:`~kerneljudge.service.store.JobStore.prune` at start and
then every :func:`sweep_interval_s` seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneljudge.executors.base import Executor, Job, JobError
from kerneljudge.service.store import JobRecord, JobStore, QueueFull
from kerneljudge.verdict import Verdict

__all__ = ["Limits", "JudgeService", "resolve_problem", "parse_job", "sweep_interval_s"]

log = logging.getLogger("kerneljudge.service")

_JOB_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: The largest candidate source accepted, in bytes (UTF-8).
MAX_SOURCE_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Admission and retention limits.

    Attributes:
        max_queued: jobs queued at once, all clients together (more: 429).
        max_per_client: jobs one client (a token, or a named client) may have queued.
        max_batch: jobs in one batch request.
        max_body_bytes: the size of one request body.
        max_source_bytes: the size of one candidate source (UTF-8).
        max_wait_s: the longest a result request may wait for its verdict.
        max_trials: the most correctness trials a job may ask for.
        max_timeout_s: the largest build limit, run limit and timing budget a job may ask for
            (seconds).
        retention_s: seconds a finished job (its result) is kept after it finished.
        max_finished_jobs: finished jobs kept at most (the oldest fetched ones deleted
            first); also the most jobs that may be pending or hold a result not fetched yet
            (more: 429).
    """

    max_queued: int = 10_000
    max_per_client: int = 5_000
    max_batch: int = 256
    max_body_bytes: int = 16 << 20
    max_source_bytes: int = MAX_SOURCE_BYTES
    max_wait_s: float = 60.0
    max_trials: int = 100
    max_timeout_s: float = 900.0
    retention_s: float = 7 * 86400.0
    max_finished_jobs: int = 100_000


def sweep_interval_s(retention_s: float) -> float:
    """Seconds between two retention sweeps: a quarter of the retention period, within
    [0.5, 60]."""
    return min(60.0, max(0.5, retention_s / 4))


def resolve_problem(spec: str, problems_dir: Path | None) -> str:
    """The problem a job may name: a bundled problem's name (returned as it is), or a ``.py``
    file under ``problems_dir`` given relative to it (returned as its absolute path, symbolic
    links resolved). Anything else, an absolute path or one that leaves the folder included,
    raises ``ValueError`` (one line)."""
    from kerneljudge.problem import bundled_problem_names

    if spec in bundled_problem_names():
        return spec
    refusal = "job.problem must be a bundled problem name" + (
        " or a .py file under the server's problems folder" if problems_dir else ""
    )
    if problems_dir is None or "\x00" in spec or spec.startswith(("/", "~")):
        raise ValueError(f"{refusal}, not {spec[:200]!r}")
    try:
        root = problems_dir.resolve()
        path = (root / spec).resolve()
        allowed = path.is_relative_to(root) and path.suffix == ".py" and path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, ...
        allowed = False
    if not allowed:
        raise ValueError(f"{refusal}, not {spec[:200]!r}")
    return str(path)


def parse_job(data: Any, problems_dir: Path | None, limits: Limits) -> tuple[Job, str]:
    """Check one job as a client sent it; returns (the job to judge, its problem as named).

    Raises:
        ValueError: a field is missing or wrong, an option is out of range or not allowed
            (``cache_dir``), the source is too large, or the problem is not allowed (one line).
    """
    try:
        job = Job.from_dict(data)
    except TypeError as exc:  # a value of a type no range check expected
        raise ValueError(f"a job field has a value of the wrong type: {exc}") from None
    if job.options.cache_dir is not None:
        raise ValueError("options.cache_dir is set by the server, not by a client")
    try:
        size = len(job.source.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("job.source is not valid Unicode (a lone surrogate)") from None
    if size > limits.max_source_bytes:
        raise ValueError(f"job.source is larger than {limits.max_source_bytes} bytes")
    o = job.options
    if o.trials > limits.max_trials:
        raise ValueError(f"options.trials is at most {limits.max_trials} on this server")
    for name in ("build_timeout_s", "run_timeout_s", "max_time_s"):
        value = getattr(o, name)
        if value is not None and not value <= limits.max_timeout_s:  # refuses inf and nan
            raise ValueError(f"options.{name} is at most {limits.max_timeout_s:g} on this server")
    if not _JOB_ID.fullmatch(job.job_id) or job.job_id in (".", ".."):
        # '.' and '..' are dot segments: a URL with one does not name the job.
        raise ValueError("job.job_id is 1 to 128 of A-Z a-z 0-9 . _ : -, not '.' or '..'")
    if (
        len(job.name) > 255
        or job.name in (".", "..")
        or any(c in "/\\" or not c.isprintable() for c in job.name)
    ):
        raise ValueError("job.name is a file name (no '/', at most 255 characters)")
    named = job.problem
    return dataclasses.replace(job, problem=resolve_problem(named, problems_dir)), named


class JudgeService:
    """The store, the executor and the dispatcher thread between them.

    Args:
        store: the job database.
        executor_factory: builds the executor (called in :meth:`start`).
        limits: admission limits.
        problems_dir: the folder of problem files jobs may name (None: bundled ones only).
        max_in_flight: jobs handed to the executor at once (0: two per device slot of the
            executor, as its ``stats().busy_share`` lists them).
    """

    def __init__(
        self,
        store: JobStore,
        executor_factory: Callable[[], Executor],
        limits: Limits | None = None,
        problems_dir: Path | None = None,
        max_in_flight: int = 0,
    ) -> None:
        self.store = store
        self.limits = limits or Limits()
        self.problems_dir = problems_dir
        self.max_in_flight = max_in_flight
        self._factory = executor_factory
        self.executor: Executor | None = None
        self._wake = threading.Condition()
        self._in_flight: dict[str, Future[Verdict]] = {}  # by run_id
        self._stop = False
        self._thread: threading.Thread | None = None
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()  # set to stop the retention thread
        self.started_at = time.time()
        self.requeued = 0
        #: Jobs deleted by retention since start: for their age, and for the bound.
        self.deleted = {"expired": 0, "over_cap": 0}
        self.last_sweep_at: float | None = None

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Put jobs left ``running`` by a dead service back in the queue, apply retention
        once, start the executor, the dispatcher and the retention thread."""
        self.requeued = self.store.requeue_running()
        if self.requeued:
            log.warning(
                "%d jobs were running when the service stopped: queued again", self.requeued
            )
        self.sweep()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="kj-retention", daemon=True)
        self._sweeper.start()
        self.executor = self._factory()
        if self.max_in_flight <= 0:
            self.max_in_flight = 2 * max(1, len(self.executor.stats().busy_share))
        self._thread = threading.Thread(target=self._dispatch, name="kj-dispatch", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop_dispatching` or :meth:`close` was called."""
        return self._stop

    def stop_dispatching(self) -> None:
        """Hand no more jobs to the executor (those it holds go on until :meth:`close`)."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()

    def close(self) -> None:
        """Stop dispatching and close the executor; jobs it held without finishing go back
        to ``queued`` with their attempt given back (judged at the next start)."""
        self.stop_dispatching()
        self._stop_sweeping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sweeper is not None:
            self._sweeper.join(timeout=30)
        if self.executor is not None:
            self.executor.close()
        self.store.requeue_running(clean_stop=True)  # judged at the next start

    # -- admission -----------------------------------------------------------------------------

    def submit(self, items: list[Any], client: str) -> list[tuple[JobRecord, bool]]:
        """Check and record jobs (all or none).

        Raises:
            ValueError: a job is invalid (the message names its index in a batch).
            QueueFull: no room (see :class:`~kerneljudge.service.store.QueueFull`).
            JobConflict: a job id already names another job.
        """
        jobs = []
        for i, data in enumerate(items):
            try:
                jobs.append(parse_job(data, self.problems_dir, self.limits))
            except ValueError as exc:
                prefix = f"jobs[{i}]: " if len(items) > 1 else ""
                raise ValueError(prefix + " ".join(str(exc).split())) from None
        try:
            out = self.store.add(
                jobs,
                client,
                self.limits.max_queued,
                self.limits.max_per_client,
                max_unfetched=self.limits.max_finished_jobs,
            )
        except QueueFull as exc:
            raise QueueFull(str(exc), self.retry_after_s()) from None
        if any(created for _, created in out):
            with self._wake:
                self._wake.notify_all()
        return out

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait: the time the executor needs for a tenth of
        the queue at its rate over the last minute, within [1, 60]."""
        rate = self.rate_1m()
        queued = self.store.counts()["queued"]
        if rate <= 0:
            return 10
        return int(min(60, max(1, queued / 10 / rate)))

    def rate_1m(self) -> float:
        """Verdicts per second over the last minute, or over this service's life when it is
        shorter (at least a second)."""
        now = time.time()
        window = min(60.0, max(1.0, now - self.started_at))
        return self.store.finished_since(now - window) / window

    def cancel(self, job_id: str, client: str | None = None) -> bool:
        """Cancel ``client``'s job ``job_id`` (None: see :class:`JobStore`) if it has not
        started: queued here, or handed to the executor and not started there. True when
        cancelled."""
        record = self.store.get(job_id, client)
        if record is None:
            return False
        if self.store.cancel_queued(record.seq):
            return True
        with self._wake:
            pending = record.run_id in self._in_flight
        return bool(pending and self.executor is not None and self.executor.cancel(record.run_id))

    # -- retention -----------------------------------------------------------------------------

    def sweep(self) -> tuple[int, int]:
        """Apply retention now (:meth:`JobStore.prune` with this service's limits); the jobs
        deleted (for their age, for the bound)."""
        expired, over_cap = self.store.prune(self.limits.retention_s, self.limits.max_finished_jobs)
        self.deleted["expired"] += expired
        self.deleted["over_cap"] += over_cap
        self.last_sweep_at = time.time()
        if expired or over_cap:
            log.info("retention: %d jobs expired, %d over the bound deleted", expired, over_cap)
        return expired, over_cap

    def _sweep_loop(self) -> None:
        while not self._stop_sweeping.wait(sweep_interval_s(self.limits.retention_s)):
            try:
                self.sweep()
            except Exception:  # a locked or failing database: try again at the next sweep
                log.exception("cannot apply retention to the job database")

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        while True:
            with self._wake:
                while not self._stop and len(self._in_flight) >= self.max_in_flight:
                    self._wake.wait(1.0)
                if self._stop:
                    return
            try:
                record = self.store.claim_next()
            except Exception:  # a locked or failing database: try again shortly
                log.exception("cannot read the job queue")
                record = None
            if record is None:
                with self._wake:
                    if not self._stop:
                        self._wake.wait(0.5)
                continue
            self._hand_out(record)

    def _hand_out(self, record: JobRecord) -> None:
        assert self.executor is not None
        if self._stop:  # a stop came while it was claimed: left "running", given back at close
            return
        try:
            job = dataclasses.replace(record.job(), job_id=record.run_id)
            future = self.executor.submit(job)
        except Exception as exc:  # the executor refused it (closed) or the row is unreadable
            if self._stop:
                return  # stays running: queued again at the next start
            self._record_error(record.seq, JobError(" ".join(str(exc).split()) or repr(exc)))
            return
        with self._wake:
            self._in_flight[record.run_id] = future
        future.add_done_callback(functools.partial(self._done, record))

    def _done(self, record: JobRecord, future: Future[Verdict]) -> None:
        try:
            if future.cancelled():
                if self._stop:
                    return  # the executor closed under it: queued again at the next start
                self._record_error(record.seq, JobError("cancelled", kind="cancelled"))
                return
            exc = future.exception()
            if exc is None:
                verdict = future.result()
                if not self.store.finish(record.seq, "done", verdict_json=verdict.to_json(None)):
                    log.warning("job %s already had its result: this one is dropped", record.run_id)
            elif isinstance(exc, JobError):
                if exc.kind == "cancelled" and self._stop:
                    return  # the executor closed under it: queued again at the next start
                self._record_error(record.seq, exc)
            else:
                message = " ".join(str(exc).split()) or type(exc).__name__
                self._record_error(record.seq, JobError(message))
        except Exception:
            log.exception("cannot record the result of job %s", record.run_id)
        finally:
            with self._wake:
                self._in_flight.pop(record.run_id, None)
                self._wake.notify_all()

    def _record_error(self, seq: int, exc: JobError) -> None:
        state = "cancelled" if exc.kind == "cancelled" else "failed"
        self.store.finish(seq, state, error_kind=exc.kind, error=str(exc))

    # -- reports -------------------------------------------------------------------------------

    def in_flight(self) -> int:
        with self._wake:
            return len(self._in_flight)

    def metrics(self) -> dict[str, Any]:
        """Queue depth, counts by state, the executor's load, verdict rates and retention
        (``retention``: its limits, jobs deleted since start for their age and for the bound,
        jobs deleted over the database's life, the last sweep's UNIX time) (JSON-ready)."""
        counts = self.store.counts()
        now = time.time()
        stats = self.executor.stats() if self.executor is not None else None
        return {
            "queue_depth": counts["queued"],
            "in_flight": self.in_flight(),
            "states": counts,
            "verdicts_per_s_1m": self.rate_1m(),
            "verdicts_per_s": stats.verdicts_per_s if stats else 0.0,
            "busy_share": dict(stats.busy_share) if stats else {},
            "executor": dataclasses.asdict(stats) if stats else None,
            "uptime_s": now - self.started_at,
            "requeued_at_start": self.requeued,
            "retention": {
                "retention_s": self.limits.retention_s,
                "max_finished_jobs": self.limits.max_finished_jobs,
                "deleted_expired": self.deleted["expired"],
                "deleted_over_cap": self.deleted["over_cap"],
                "deleted_total": self.store.deleted_total(),
                "last_sweep_at": self.last_sweep_at,
            },
        }
