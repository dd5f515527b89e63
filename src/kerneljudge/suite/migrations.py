"""The results store's schema, as ordered migration steps.

A store file records the steps applied to it in ``schema_version`` (one row per step:
``version``, ``applied_at``). Opening a file applies the missing steps in order, each in its own
transaction, so a file written by an older kerneljudge is brought up to date and a failure
leaves it at the last complete step. A file whose version is newer than :data:`LATEST` is
refused. Steps are appended, never edited: a released step is what old files already hold.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["LATEST", "MIGRATIONS", "current_version", "migrate"]

_V1 = """
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    state       TEXT NOT NULL,
    owner       TEXT NOT NULL DEFAULT '',
    model       TEXT NOT NULL DEFAULT '',
    sampling    TEXT NOT NULL DEFAULT '{}',
    metadata    TEXT NOT NULL DEFAULT '{}',
    spec        TEXT NOT NULL DEFAULT '{}',
    device      TEXT NOT NULL DEFAULT '',
    versions    TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE run_problems (
    run_id      TEXT NOT NULL REFERENCES runs(run_id),
    problem     TEXT NOT NULL,
    path        TEXT NOT NULL DEFAULT '',
    level       INTEGER,
    tags        TEXT NOT NULL DEFAULT '[]',
    planned     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, problem)
);
CREATE TABLE verdicts (
    id               INTEGER PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES runs(run_id),
    problem          TEXT NOT NULL,
    level            INTEGER,
    tags             TEXT NOT NULL DEFAULT '[]',
    sample           TEXT NOT NULL,
    candidate_path   TEXT NOT NULL DEFAULT '',
    candidate_source TEXT NOT NULL,
    candidate_sha256 TEXT NOT NULL,
    backend          TEXT NOT NULL DEFAULT '',
    status           TEXT NOT NULL,
    verdict          TEXT NOT NULL,
    device           TEXT NOT NULL DEFAULT '',
    versions         TEXT NOT NULL DEFAULT '{}',
    started_at       TEXT NOT NULL DEFAULT '',
    finished_at      TEXT NOT NULL DEFAULT '',
    stored_at        TEXT NOT NULL,
    UNIQUE (run_id, problem, sample)
);
"""

_V2 = """
ALTER TABLE verdicts ADD COLUMN speedup REAL;
ALTER TABLE verdicts ADD COLUMN speedup_lo REAL;
ALTER TABLE verdicts ADD COLUMN speedup_hi REAL;
CREATE INDEX verdicts_by_run ON verdicts (run_id, problem);
CREATE TABLE episodes (
    verdict_id  INTEGER PRIMARY KEY REFERENCES verdicts(id),
    transcript  TEXT NOT NULL,
    summary     TEXT,
    stored_at   TEXT NOT NULL
);
"""

_V3 = """
CREATE TABLE planned_pairs (
    run_id      TEXT NOT NULL REFERENCES runs(run_id),
    problem     TEXT NOT NULL,
    sample      TEXT NOT NULL,
    path        TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, problem, sample)
);
INSERT OR IGNORE INTO planned_pairs (run_id, problem, sample, path)
    SELECT run_id, problem, sample, candidate_path FROM verdicts;
UPDATE run_problems SET planned = MAX(planned, (
    SELECT COUNT(*) FROM planned_pairs q
    WHERE q.run_id = run_problems.run_id AND q.problem = run_problems.problem
));
"""

#: The speedups a stored verdict can be read by: its launched calls' or its graph replays'.
TIMINGS = ("launched", "graph")


def speedup_columns(
    verdict: dict, timing: str = "launched"
) -> tuple[float | None, float | None, float | None]:
    """``(median, lo, hi)`` of a verdict dict's eager speedup, or Nones when not timed so.

    ``timing``: ``"launched"`` (the timing stage's launched calls, ``timing.speedups``) or
    ``"graph"`` (its CUDA-graph replays, ``timing.graph.speedups``: Nones where the verdict has
    none, as where either side could not be captured or the device is a CPU).

    Raises:
        ValueError: another ``timing``.
    """
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
    timing_dict = verdict.get("timing") or {}
    if timing == "graph":
        timing_dict = timing_dict.get("graph") or {}
    for s in timing_dict.get("speedups") or []:
        if s.get("baseline") == "eager":
            lo, hi = (s.get("ci95") or [None, None])[:2]
            return s.get("median"), lo, hi
    return None, None, None


def _backfill_speedups(db: sqlite3.Connection) -> None:
    rows = db.execute("SELECT id, verdict FROM verdicts").fetchall()
    for vid, text in rows:
        med, lo, hi = speedup_columns(json.loads(text))
        db.execute(
            "UPDATE verdicts SET speedup = ?, speedup_lo = ?, speedup_hi = ? WHERE id = ?",
            (med, lo, hi, vid),
        )


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def apply(db: sqlite3.Connection) -> None:
        for statement in sql.split(";"):
            if statement.strip():
                db.execute(statement)

    return apply


def _v2(db: sqlite3.Connection) -> None:
    _script(_V2)(db)
    _backfill_speedups(db)


#: The steps, in order: step ``i`` (1-based) takes a file from version ``i - 1`` to ``i``.
#: 1: runs, their problems, verdicts. 2: the eager speedup and its interval as columns
#: (filled from the stored verdicts), an index by run, and episode transcripts. 3: each run's
#: planned pairs (filled from its verdicts: a judged pair was planned; the pairs planned but
#: not judged before this step are unknown, so each problem keeps its planned count, raised
#: to its judged pairs where it was lower).
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (_script(_V1), _v2, _script(_V3))
LATEST = len(MIGRATIONS)


def current_version(db: sqlite3.Connection) -> int:
    """The version a store file is at (0 for a new, empty file)."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_version "
        "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(db: sqlite3.Connection, target: int = LATEST) -> int:
    """Apply the missing steps up to ``target``, each in one transaction; return the version.

    ``db`` must be in autocommit mode (``isolation_level=None``).

    Raises:
        ValueError: the file is at a version newer than ``target``'s code knows.
    """
    version = current_version(db)
    if version > LATEST:
        raise ValueError(
            f"results store schema version {version} is newer than this kerneljudge "
            f"supports ({LATEST}); upgrade kerneljudge"
        )
    while version < target:
        step = MIGRATIONS[version]
        db.execute("BEGIN IMMEDIATE")
        try:
            if current_version(db) != version:  # another process migrated meanwhile
                db.execute("ROLLBACK")
                version = current_version(db)
                continue
            step(db)
            version += 1
            db.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, datetime.now(UTC).isoformat(timespec="seconds")),
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return version
