"""The service's durable queue and results: one SQLite file (WAL journal, ``synchronous=FULL``).

A job's life: ``queued`` (accepted, written before the service answers) -> ``running`` (handed
to the executor) -> one of ``done`` (a verdict), ``failed`` (a :class:`JobError`: no verdict) or
``cancelled``. A job found ``running`` when the store opens belongs to a service that died: it
goes back to ``queued`` (:meth:`JobStore.requeue_running`) and is judged again. Every write of
an end state is conditional on the job being ``running`` (``cancelled``: ``queued``), so a job
gets exactly one end state and one result however many times it is handed out.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneljudge.executors.base import Job

__all__ = ["SCHEMA_VERSION", "STATES", "JobRecord", "JobStore", "QueueFull", "JobConflict"]

#: The layout of the database file; a file of another version is refused.
SCHEMA_VERSION = 1
STATES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = ("done", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    client TEXT NOT NULL,
    state TEXT NOT NULL,
    problem TEXT NOT NULL,
    source_sha256 TEXT NOT NULL,
    job_json TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    verdict_json TEXT,
    error_kind TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, seq);
CREATE INDEX IF NOT EXISTS jobs_client ON jobs (client, state);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished_at);
"""


#: Times a job may be handed out; after that many stops of the service while it ran, it fails.
MAX_ATTEMPTS = 3


class QueueFull(Exception):
    """The queue (or the client's share of it) has no room; ``retry_after_s`` is a hint."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class JobConflict(Exception):
    """A job id already names a different job (another problem, source or options)."""


@dataclass(frozen=True)
class JobRecord:
    """One stored job. Times are UNIX seconds (None: not reached yet)."""

    job_id: str
    state: str
    problem: str
    source_sha256: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    verdict_json: str | None
    error_kind: str | None
    error: str | None
    job_json: str

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def job(self) -> Job:
        """The job as it is handed to the executor (its problem resolved on this machine)."""
        return Job.from_dict(json.loads(self.job_json))

    def status(self) -> dict[str, Any]:
        """The JSON-ready status (no verdict)."""
        return {
            "job_id": self.job_id,
            "state": self.state,
            "problem": self.problem,
            "source_sha256": self.source_sha256,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "attempts": self.attempts,
            "error_kind": self.error_kind,
            "error": self.error,
        }


_COLUMNS = (
    "job_id, state, problem, source_sha256, submitted_at, started_at, finished_at, attempts, "
    "verdict_json, error_kind, error, job_json"
)


def _same_job(a: Job, b: Job) -> bool:
    return (a.problem, a.source, a.options, a.name) == (b.problem, b.source, b.options, b.name)


class JobStore:
    """The queue and results in one SQLite file. Thread-safe (one connection, one lock).

    Raises:
        RuntimeError: (on open) the file holds another schema version, or another store
            holds it open (an exclusive lock on ``<path>.lock``).
        sqlite3.Error: the file cannot be opened or written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        # One service per file: a second one would hand out the same queued jobs.
        self._flock = open(self.path.with_name(self.path.name + ".lock"), "a+")  # noqa: SIM115
        try:
            fcntl.flock(self._flock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._flock.close()
            raise RuntimeError(f"{self.path} is in use by another kerneljudge service") from None
        self._db = sqlite3.connect(
            str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                self._db.execute(stmt)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) != SCHEMA_VERSION:
                self._db.execute("ROLLBACK")
                raise RuntimeError(
                    f"{self.path}: job database schema version {row[0]}, this kerneljudge "
                    f"reads version {SCHEMA_VERSION}"
                )
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._flock.close()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[JobRecord]:
        with self._lock:
            return [JobRecord(*r) for r in self._db.execute(sql, args).fetchall()]

    def add(
        self,
        jobs: list[tuple[Job, str]],
        client: str,
        max_queued: int,
        max_per_client: int,
    ) -> list[tuple[JobRecord, bool]]:
        """Record ``jobs`` (each with the problem as the client named it) as ``queued``, all or
        none, in one transaction; a job id already stored is answered with its record (False:
        not new). Returns (record, created) per job, in order.

        Raises:
            QueueFull: more than ``max_queued`` jobs (``max_per_client`` of this client) would
                be queued.
            JobConflict: a job id names a stored job with other content.
        """
        now = time.time()
        out: list[tuple[JobRecord, bool]] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                new: list[tuple[Job, str]] = []
                seen: dict[str, Job] = {}
                for job, problem in jobs:
                    old = self._one(job.job_id)
                    prior = old.job() if old is not None else seen.get(job.job_id)
                    if prior is not None and not _same_job(prior, job):
                        raise JobConflict(f"job_id {job.job_id} already names another job")
                    if old is None and job.job_id not in seen:
                        new.append((job, problem))
                        seen[job.job_id] = job
                if new:
                    self._check_room(len(new), client, max_queued, max_per_client)
                for job, problem in new:
                    self._db.execute(
                        "INSERT INTO jobs (job_id, client, state, problem, source_sha256, "
                        "job_json, submitted_at) VALUES (?, ?, 'queued', ?, ?, ?, ?)",
                        (
                            job.job_id,
                            client,
                            problem,
                            job.source_sha256,
                            json.dumps(job.to_dict()),
                            now,
                        ),
                    )
                created = {job.job_id for job, _ in new}
                for job, _ in jobs:
                    record = self._one(job.job_id)
                    assert record is not None
                    out.append((record, job.job_id in created))
                    created.discard(job.job_id)  # a repeat inside one batch is not new
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return out

    def _check_room(self, n: int, client: str, max_queued: int, max_per_client: int) -> None:
        (queued,) = self._db.execute("SELECT COUNT(*) FROM jobs WHERE state='queued'").fetchone()
        if queued + n > max_queued:
            raise QueueFull(f"the queue is full ({queued} of {max_queued} jobs queued)", 5)
        (mine,) = self._db.execute(
            "SELECT COUNT(*) FROM jobs WHERE state='queued' AND client=?", (client,)
        ).fetchone()
        if mine + n > max_per_client:
            raise QueueFull(f"this client has {mine} jobs queued (at most {max_per_client})", 5)

    def _one(self, job_id: str) -> JobRecord | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        return JobRecord(*row) if row else None

    def get(self, job_id: str) -> JobRecord | None:
        """The stored job ``job_id``, or None."""
        with self._lock:
            return self._one(job_id)

    def requeue_running(self) -> int:
        """Put every ``running`` job back to ``queued`` (at open, after a crash); their count.
        A job that was running :data:`MAX_ATTEMPTS` times already (one that may be what takes
        the service down) fails instead (error kind ``harness``), so it cannot crash-loop it."""
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET state='failed', error_kind='harness', finished_at=?, "
                "error='the service stopped while judging this job ' || attempts || ' times' "
                "WHERE state='running' AND attempts>=?",
                (time.time(), MAX_ATTEMPTS),
            )
            cur = self._db.execute(
                "UPDATE jobs SET state='queued', started_at=NULL WHERE state='running'"
            )
            return cur.rowcount

    def claim_next(self) -> JobRecord | None:
        """The oldest ``queued`` job, now marked ``running`` (its attempt counted), or None."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT job_id FROM jobs WHERE state='queued' ORDER BY seq LIMIT 1"
                ).fetchone()
                if row is None:
                    self._db.execute("COMMIT")
                    return None
                self._db.execute(
                    "UPDATE jobs SET state='running', started_at=?, attempts=attempts+1 "
                    "WHERE job_id=? AND state='queued'",
                    (time.time(), row[0]),
                )
                record = self._one(row[0])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return record

    def finish(
        self,
        job_id: str,
        state: str,
        verdict_json: str | None = None,
        error_kind: str | None = None,
        error: str | None = None,
    ) -> bool:
        """Write the end state of a ``running`` job; False (nothing written) when it is not
        running (already finished, or never handed out)."""
        if state not in FINISHED:
            raise ValueError(f"not an end state: {state}")
        with self._lock:
            cur = self._db.execute(
                "UPDATE jobs SET state=?, verdict_json=?, error_kind=?, error=?, finished_at=? "
                "WHERE job_id=? AND state='running'",
                (state, verdict_json, error_kind, error, time.time(), job_id),
            )
            return cur.rowcount == 1

    def cancel_queued(self, job_id: str) -> bool:
        """Cancel a job still ``queued``; True when it was."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE jobs SET state='cancelled', error_kind='cancelled', "
                "error='cancelled before it started', finished_at=? "
                "WHERE job_id=? AND state='queued'",
                (time.time(), job_id),
            )
            return cur.rowcount == 1

    def counts(self) -> dict[str, int]:
        """Jobs per state (every state named, 0 where none)."""
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        out = dict.fromkeys(STATES, 0)
        out.update({state: n for state, n in rows})
        return out

    def finished_since(self, since: float) -> int:
        """Jobs that ended with a verdict (``done``) at or after UNIX time ``since``."""
        with self._lock:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM jobs WHERE state='done' AND finished_at>=?", (since,)
            ).fetchone()
        return int(n)

    def all_records(self) -> list[JobRecord]:
        """Every stored job, in submission order."""
        return self._rows(f"SELECT {_COLUMNS} FROM jobs ORDER BY seq")
