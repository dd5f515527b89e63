"""The service's durable queue and results: one SQLite file (WAL journal, ``synchronous=FULL``).

A job's life: ``queued`` (accepted, written before the service answers) -> ``running`` (handed
to the executor) -> one of ``done`` (a verdict), ``failed`` (a :class:`JobError`: no verdict) or
``cancelled``. A job found ``running`` when the store opens belongs to a service that died: it
goes back to ``queued`` (:meth:`JobStore.requeue_running`) and is judged again. Every write of
an end state is conditional on the job being ``running`` (``cancelled``: ``queued``), so a job
gets exactly one end state and one result however many times it is handed out.

Job ids are per client: ``(client, job_id)`` names a job, and the same id sent by two clients
names two jobs. Inside the store (and to the executor) a job is its ``seq``, the row number
SQLite never hands out twice (``AUTOINCREMENT``), so ids never collide there.

Retention (:meth:`JobStore.prune`): a finished job is deleted once it has been finished longer
than the retention period, and the oldest finished jobs whose result was fetched are deleted
while more than ``max_finished`` jobs are finished. A result nobody fetched is kept for the
whole retention period; instead, :meth:`JobStore.add` refuses new jobs while unfetched results
and pending jobs would pass ``max_finished`` (one client's alone: half of it). A deleted job
leaves a tombstone (client, job id), kept one more retention period and at least
:data:`TOMBSTONE_MIN_S` (at most ``max_finished``): a request for it gets "expired", not
"unknown".
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from kerneljudge.executors.base import Job
from kerneljudge.service import _schema

__all__ = ["SCHEMA_VERSION", "STATES", "JobRecord", "JobStore", "QueueFull", "JobConflict"]

#: The layout of the database file; an older one is migrated, a newer one refused.
SCHEMA_VERSION = _schema.SCHEMA_VERSION
STATES = _schema.STATES
FINISHED = _schema.FINISHED
JobRecord = _schema.JobRecord
_COLUMNS = _schema.COLUMNS
_FINISHED_SQL = "state IN ('done', 'failed', 'cancelled')"
#: Rows deleted per transaction by :meth:`JobStore.prune` (the store's lock is let go between).
PRUNE_CHUNK = 500
#: The least time a tombstone is kept, seconds (longer than the retention period when that is
#: short: a tombstone is a few dozen bytes).
TOMBSTONE_MIN_S = 7 * 86400.0

#: The (device, inode) of every database file a store of this process holds open.
_OPEN: set[tuple[int, int]] = set()
_OPEN_LOCK = threading.Lock()

#: Times a job may be handed out; after that many stops of the service while it ran, it fails.
MAX_ATTEMPTS = 3


class QueueFull(Exception):
    """The queue (or the client's share of it) has no room; ``retry_after_s`` is a hint."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class JobConflict(Exception):
    """A job id already names a different job (another problem, source or options)."""


def _same_job(a: Job, b: Job) -> bool:
    return (a.problem, a.source, a.options, a.name) == (b.problem, b.source, b.options, b.name)


class JobStore:
    """The queue and results in one SQLite file. Thread-safe (one connection, one lock).

    A job is named by its ``seq`` (an int: the dispatcher's name) or by its ``job_id`` in
    ``client``'s namespace; a ``job_id`` with ``client`` None names the oldest stored job of
    that id, whichever client it belongs to.

    Raises:
        RuntimeError: (on open) the file holds a newer schema version, or another store
            holds it open (an exclusive ``flock`` on the database file itself, so a second
            name for it, a symbolic or a hard link, is refused too).
        sqlite3.Error: the file cannot be opened or written.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        # One service per file: a second one would hand out the same queued jobs. The lock is
        # an flock on the file (its inode), whatever name opened it; flock and SQLite's fcntl
        # locks do not meet. No descriptor of a file this process's SQLite holds open may be
        # closed (that drops the process's fcntl locks on it), so a second store of this
        # process is refused by the file's (device, inode) before any descriptor is opened,
        # and this one is closed only after SQLite's connection.
        with _OPEN_LOCK:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) in _OPEN:
                    raise RuntimeError(f"{self.path} is in use by another kerneljudge service")
            except FileNotFoundError:
                pass
            self._flock = open(self.path, "ab")  # noqa: SIM115 - held for the store's life
            try:
                fcntl.flock(self._flock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._flock.close()  # another process's: no SQLite of this one has the file
                raise RuntimeError(
                    f"{self.path} is in use by another kerneljudge service"
                ) from None
            st = os.fstat(self._flock.fileno())
            self._inode = (st.st_dev, st.st_ino)
            _OPEN.add(self._inode)
        try:
            self._db = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0
            )
        except BaseException:
            self._release()
            raise
        with self._lock:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                #: The schema version the file had when opened (it is now SCHEMA_VERSION).
                self.opened_version = _schema.open_schema(self._db, self.path)
            except BaseException:
                self._db.close()
                self._release()
                raise

    def _release(self) -> None:
        with _OPEN_LOCK:
            _OPEN.discard(self._inode)
            self._flock.close()

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._release()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[JobRecord]:
        with self._lock:
            return [JobRecord(*r) for r in self._db.execute(sql, args).fetchall()]

    @staticmethod
    def _where(ref: int | str, client: str | None) -> tuple[str, tuple[Any, ...]]:
        """The row ``ref`` names (see the class doc) as a WHERE clause and its arguments."""
        if isinstance(ref, int):
            return "seq=?", (ref,)
        if client is not None:
            return "client=? AND job_id=?", (client, ref)
        return "seq=(SELECT MIN(seq) FROM jobs WHERE job_id=?)", (ref,)

    def add(
        self,
        jobs: list[tuple[Job, str]],
        client: str,
        max_queued: int,
        max_per_client: int,
        max_unfetched: int | None = None,
    ) -> list[tuple[JobRecord, bool]]:
        """Record ``jobs`` (each with the problem as the client named it) as ``queued`` in
        ``client``'s namespace, all or none, in one transaction; a job id this client stored
        before is answered with its record (False: not new). Returns (record, created) per
        job, in order.

        Raises:
            QueueFull: more than ``max_queued`` jobs (``max_per_client`` of this client) would
                be queued, or more than ``max_unfetched`` jobs would be pending or finished
                with their result not fetched yet (None: no such bound).
            JobConflict: a job id names a stored job of this client with other content.
        """
        now = time.time()
        out: list[tuple[JobRecord, bool]] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                new: list[tuple[Job, str]] = []
                seen: dict[str, Job] = {}
                for job, problem in jobs:
                    old = self._one(job.job_id, client)
                    prior = old.job() if old is not None else seen.get(job.job_id)
                    if prior is not None and not _same_job(prior, job):
                        raise JobConflict(f"job_id {job.job_id} already names another job")
                    if old is None and job.job_id not in seen:
                        new.append((job, problem))
                        seen[job.job_id] = job
                if new:
                    self._check_room(len(new), client, max_queued, max_per_client)
                    self._check_unfetched(len(new), max_unfetched, client)
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
                    self._db.execute(
                        "DELETE FROM expired WHERE client=? AND job_id=?", (client, job.job_id)
                    )
                created = {job.job_id for job, _ in new}
                for job, _ in jobs:
                    record = self._one(job.job_id, client)
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

    def _check_unfetched(self, n: int, max_unfetched: int | None, client: str) -> None:
        """Refuse ``n`` more jobs past the bound on pending and unfetched jobs (the module's
        docstring): all clients' ``max_unfetched``, ``client``'s alone half of it."""
        if max_unfetched is None:
            return
        q = "SELECT COUNT(*) FROM jobs WHERE fetched_at IS NULL"
        (held,) = self._db.execute(q).fetchone()
        (mine,) = self._db.execute(q + " AND client=?", (client,)).fetchone()
        for count, most in ((mine, max(1, max_unfetched // 2)), (held, max_unfetched)):
            if count + n > most:
                raise QueueFull(
                    f"{count} jobs are pending or hold a result not fetched yet (at most "
                    f"{most}): fetch results, or wait for them to expire",
                    60,
                )

    def _one(self, ref: int | str, client: str | None = None) -> JobRecord | None:
        where, args = self._where(ref, client)
        row = self._db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE {where}", args).fetchone()
        return JobRecord(*row) if row else None

    def get(self, ref: int | str, client: str | None = None) -> JobRecord | None:
        """The stored job ``ref`` (a seq, or a job id in ``client``'s namespace), or None."""
        with self._lock:
            return self._one(ref, client)

    def expired(self, job_id: str, client: str) -> float | None:
        """When ``client``'s job ``job_id`` was deleted by :meth:`prune` (UNIX seconds), or
        None: not deleted, or its tombstone is gone too."""
        with self._lock:
            row = self._db.execute(
                "SELECT deleted_at FROM expired WHERE client=? AND job_id=?", (client, job_id)
            ).fetchone()
        return float(row[0]) if row else None

    def mark_fetched(self, seq: int) -> bool:
        """Note that a client read the result of the finished job ``seq`` (the first read
        only); True when this was the first."""
        with self._lock:
            cur = self._db.execute(
                f"UPDATE jobs SET fetched_at=? WHERE seq=? AND fetched_at IS NULL "
                f"AND {_FINISHED_SQL}",
                (time.time(), seq),
            )
            return cur.rowcount == 1

    def requeue_running(self, clean_stop: bool = False) -> int:
        """Put every ``running`` job back to ``queued``; their count. At open (after a crash):
        a job that was running :data:`MAX_ATTEMPTS` times already (one that may be what takes
        the service down) fails instead (error kind ``harness``), so it cannot crash-loop it.
        ``clean_stop`` (the service stopping on its own): the stop was not the job's doing, so
        its attempt is given back and none fails."""
        with self._lock:
            if clean_stop:
                cur = self._db.execute(
                    "UPDATE jobs SET state='queued', started_at=NULL, "
                    "attempts=MAX(attempts - 1, 0) WHERE state='running'"
                )
                return cur.rowcount
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
                    "SELECT seq FROM jobs WHERE state='queued' ORDER BY seq LIMIT 1"
                ).fetchone()
                if row is None:
                    self._db.execute("COMMIT")
                    return None
                self._db.execute(
                    "UPDATE jobs SET state='running', started_at=?, attempts=attempts+1 "
                    "WHERE seq=? AND state='queued'",
                    (time.time(), row[0]),
                )
                record = self._one(int(row[0]))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return record

    def finish(
        self,
        ref: int | str,
        state: str,
        verdict_json: str | None = None,
        error_kind: str | None = None,
        error: str | None = None,
        client: str | None = None,
    ) -> bool:
        """Write the end state of the ``running`` job ``ref``; False (nothing written) when it
        is not running (already finished, or never handed out)."""
        if state not in FINISHED:
            raise ValueError(f"not an end state: {state}")
        where, args = self._where(ref, client)
        with self._lock:
            cur = self._db.execute(
                "UPDATE jobs SET state=?, verdict_json=?, error_kind=?, error=?, finished_at=? "
                f"WHERE {where} AND state='running'",
                (state, verdict_json, error_kind, error, time.time(), *args),
            )
            return cur.rowcount == 1

    def cancel_queued(self, ref: int | str, client: str | None = None) -> bool:
        """Cancel the job ``ref`` while it is still ``queued``; True when it was."""
        where, args = self._where(ref, client)
        with self._lock:
            cur = self._db.execute(
                "UPDATE jobs SET state='cancelled', error_kind='cancelled', "
                "error='cancelled before it started', finished_at=? "
                f"WHERE {where} AND state='queued'",
                (time.time(), *args),
            )
            return cur.rowcount == 1

    def prune(
        self, retention_s: float, max_finished: int, now: float | None = None
    ) -> tuple[int, int]:
        """Delete finished jobs: those finished more than ``retention_s`` seconds before
        ``now`` (None: the time now), then the oldest finished ones whose result was fetched
        while more than ``max_finished`` are finished. Queued and running jobs, and results
        not fetched within their retention period, are never deleted. Each deleted job leaves
        a tombstone; tombstones older than ``retention_s`` (and :data:`TOMBSTONE_MIN_S`) and
        beyond the newest ``max_finished`` go. Works in transactions of :data:`PRUNE_CHUNK` rows.

        Returns:
            ``(expired, over_cap)``: jobs deleted for their age, and for the bound.
        """
        now = time.time() if now is None else now
        cutoff = now - retention_s
        expired = self._delete_chunks(
            f"SELECT seq FROM jobs WHERE {_FINISHED_SQL} AND finished_at<? "
            "ORDER BY finished_at LIMIT ?",
            (cutoff,),
            now,
        )
        over_cap = 0
        while True:
            with self._lock:
                (finished,) = self._db.execute(
                    f"SELECT COUNT(*) FROM jobs WHERE {_FINISHED_SQL}"
                ).fetchone()
            excess = finished - max_finished
            if excess <= 0:
                break
            n = self._delete_chunks(
                f"SELECT seq FROM jobs WHERE {_FINISHED_SQL} AND fetched_at IS NOT NULL "
                "ORDER BY finished_at, seq LIMIT ?",
                (),
                now,
                limit=excess,
            )
            over_cap += n
            if n < excess:
                break  # the rest are results nobody fetched yet: kept
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "DELETE FROM expired WHERE deleted_at<?",
                    (now - max(retention_s, TOMBSTONE_MIN_S),),
                )
                (tombstones,) = self._db.execute("SELECT COUNT(*) FROM expired").fetchone()
                if tombstones > max_finished:
                    self._db.execute(
                        "DELETE FROM expired WHERE rowid IN "
                        "(SELECT rowid FROM expired ORDER BY deleted_at, rowid LIMIT ?)",
                        (tombstones - max_finished,),
                    )
                if expired or over_cap:
                    self._db.execute(
                        "UPDATE meta SET value=CAST(value AS INTEGER)+? WHERE key='deleted_jobs'",
                        (expired + over_cap,),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return expired, over_cap

    def _delete_chunks(
        self, select: str, args: tuple[Any, ...], now: float, limit: int | None = None
    ) -> int:
        """Delete the rows ``select`` (a query of seqs ending ``LIMIT ?``) lists, at most
        ``limit`` (None: all), :data:`PRUNE_CHUNK` per transaction, each leaving a tombstone;
        their count."""
        total = 0
        while limit is None or total < limit:
            chunk = PRUNE_CHUNK if limit is None else min(PRUNE_CHUNK, limit - total)
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    seqs = [r[0] for r in self._db.execute(select, (*args, chunk)).fetchall()]
                    marks = ",".join("?" * len(seqs))
                    if seqs:
                        self._db.execute(
                            "INSERT OR REPLACE INTO expired (client, job_id, deleted_at) "
                            f"SELECT client, job_id, ? FROM jobs WHERE seq IN ({marks})",
                            (now, *seqs),
                        )
                        self._db.execute(f"DELETE FROM jobs WHERE seq IN ({marks})", seqs)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            total += len(seqs)
            if len(seqs) < chunk:
                break
        return total

    def deleted_total(self) -> int:
        """Jobs :meth:`prune` deleted over the file's life (since schema version 2)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='deleted_jobs'").fetchone()
        return int(row[0]) if row else 0

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
