"""The job database's layout, its version, and the migrations from older versions.

The version is ``meta.schema_version``. :func:`open_schema` creates a new file at
:data:`SCHEMA_VERSION`, migrates an older one step by step in one transaction (all steps or
none), and refuses a newer one.

Versions:

1. ``jobs`` (job ids unique across clients), ``meta``.
2. Job ids unique per client (``UNIQUE (client, job_id)``); ``jobs.fetched_at`` (when a client
   first read the finished result); ``expired`` (tombstones of jobs deleted by retention);
   ``meta.deleted_jobs`` (jobs deleted over the file's life). From 1: jobs of a peer address
   (``peer:...``, the no-token client of version 1, on loopback) become the default named
   client's (``name:anonymous``); finished jobs count as fetched (version 1 did not record
   reads, and they must not hold back admission).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneljudge.executors.base import Job

__all__ = ["SCHEMA_VERSION", "COLUMNS", "DEFAULT_CLIENT", "FINISHED", "STATES", "JobRecord",
           "open_schema"]  # fmt: skip

SCHEMA_VERSION = 2
#: The client of a request without a token and without a name (``X-Client-Id``).
DEFAULT_CLIENT = "name:anonymous"
#: A job's states, and those it ends in.
STATES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class JobRecord:
    """One stored job. Times are UNIX seconds (None: not reached yet).

    ``seq`` is the store's own number for the job (unique for ever in this file), ``client``
    the client whose namespace ``job_id`` is in, ``fetched_at`` when a client first read the
    finished result (None: not yet).
    """

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
    seq: int = 0
    client: str = ""
    fetched_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def run_id(self) -> str:
        """The job's id at the executor: ``<seq>:<job_id>``, unique across clients."""
        return f"{self.seq}:{self.job_id}"

    def job(self) -> Job:
        """The job as the client sent it (its problem resolved on this machine)."""
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


COLUMNS = (
    "job_id, state, problem, source_sha256, submitted_at, started_at, finished_at, attempts, "
    "verdict_json, error_kind, error, job_json, seq, client, fetched_at"
)

_JOBS = """
CREATE TABLE {name} (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
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
    error TEXT,
    fetched_at REAL,
    UNIQUE (client, job_id)
)
"""

_REST = """
CREATE INDEX jobs_state ON jobs (state, seq);
CREATE INDEX jobs_client ON jobs (client, state);
CREATE INDEX jobs_finished ON jobs (finished_at);
CREATE INDEX jobs_unfetched ON jobs (seq) WHERE fetched_at IS NULL;
CREATE TABLE expired (
    client TEXT NOT NULL,
    job_id TEXT NOT NULL,
    deleted_at REAL NOT NULL,
    PRIMARY KEY (client, job_id)
);
CREATE INDEX expired_at ON expired (deleted_at);
INSERT INTO meta VALUES ('deleted_jobs', '0');
"""

_V1_COLUMNS = (
    "seq, job_id, client, state, problem, source_sha256, job_json, submitted_at, started_at, "
    "finished_at, attempts, verdict_json, error_kind, error"
)


def _run(db: sqlite3.Connection, script: str) -> None:
    for stmt in filter(str.strip, script.split(";")):
        db.execute(stmt)


def _create(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(_JOBS.format(name="jobs"))
    _run(db, _REST)


def _from_1(db: sqlite3.Connection) -> None:
    """Version 1 -> 2: rebuild ``jobs`` (SQLite cannot drop a UNIQUE constraint), keeping
    every row and its ``seq``, and the sequence's high-water mark."""
    (high,) = db.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name='jobs'"
    ).fetchone()
    db.execute(_JOBS.format(name="jobs_v2"))
    db.execute(
        f"INSERT INTO jobs_v2 ({_V1_COLUMNS}, fetched_at) SELECT seq, job_id, "
        "CASE WHEN client LIKE 'peer:%' THEN ? ELSE client END, state, problem, "
        "source_sha256, job_json, submitted_at, started_at, finished_at, attempts, "
        "verdict_json, error_kind, error, "
        "CASE WHEN state IN ('done', 'failed', 'cancelled') THEN finished_at END "
        "FROM jobs ORDER BY seq",
        (DEFAULT_CLIENT,),
    )
    for index in ("jobs_state", "jobs_client", "jobs_finished"):
        db.execute(f"DROP INDEX IF EXISTS {index}")
    db.execute("DROP TABLE jobs")
    db.execute("ALTER TABLE jobs_v2 RENAME TO jobs")
    db.execute("UPDATE sqlite_sequence SET seq=MAX(seq, ?) WHERE name='jobs'", (high,))
    _run(db, _REST)


_MIGRATIONS = {1: _from_1}


def open_schema(db: sqlite3.Connection, path: Path) -> int:
    """Bring the database ``db`` (the file ``path``) to :data:`SCHEMA_VERSION`: create it when
    empty, migrate it when older, in one transaction. Returns the version it had (0: new).

    Raises:
        RuntimeError: the file holds a newer (or unknown) schema version.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            _create(db)
            version = 0
        else:
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row is not None else 0
            if version == 0:  # a meta table written before its version: never by kerneljudge
                raise RuntimeError(f"{path}: not a kerneljudge job database (no schema version)")
            if version > SCHEMA_VERSION or (
                version < SCHEMA_VERSION and version not in _MIGRATIONS
            ):
                raise RuntimeError(
                    f"{path}: job database schema version {version}, this kerneljudge "
                    f"reads version {SCHEMA_VERSION}"
                )
            for step in range(version, SCHEMA_VERSION):
                _MIGRATIONS[step](db)
        db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return version
