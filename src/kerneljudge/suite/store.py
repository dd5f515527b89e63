"""The results store: every verdict of every suite run, in one SQLite file.

Where the file is: the ``path`` given, else ``$KERNELJUDGE_STORE``, else
``~/.kerneljudge/results.db``. The schema and its migrations are in
:mod:`kerneljudge.suite.migrations`; ``docs/suites.md`` describes the tables.

Each verdict is committed in its own transaction: a pair of (problem, sample) is done exactly
when its row exists, which is what a resumed run skips. ``UNIQUE (run_id, problem, sample)``
makes a second verdict for a done pair an error rather than a silent duplicate.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kerneljudge.errors import KernelJudgeError
from kerneljudge.suite.metrics import Sample
from kerneljudge.suite.migrations import migrate, speedup_columns
from kerneljudge.suite.rows import RunInfo, StoredVerdict
from kerneljudge.verdict import Verdict

__all__ = ["ResultsStore", "RunInfo", "StoreError", "StoredVerdict", "default_store_path"]


class StoreError(KernelJudgeError):
    """The store cannot be opened, or a run or verdict in it is not what was asked for."""


def default_store_path() -> Path:
    """``$KERNELJUDGE_STORE``, else ``~/.kerneljudge/results.db``."""
    env = os.environ.get("KERNELJUDGE_STORE")
    return Path(env) if env else Path.home() / ".kerneljudge" / "results.db"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


_VERDICT_COLUMNS = (
    "v.id, v.run_id, v.problem, v.level, v.tags, v.sample, v.candidate_path, "
    "v.candidate_source, v.candidate_sha256, v.backend, v.status, v.verdict, v.device, "
    "v.versions, v.started_at, v.finished_at, v.stored_at, v.speedup, v.speedup_lo, "
    "v.speedup_hi, e.transcript"
)


class ResultsStore:
    """A results store file; open it, add runs and verdicts, query them.

    Args:
        path: the SQLite file; None: :func:`default_store_path`.
        create: make the file (and its folder) when it is missing; with False a missing
            file is refused, so that reading a mistyped path neither succeeds empty nor
            leaves a new file behind.

    Raises:
        StoreError: the file is missing (and ``create`` is False), cannot be opened, is not
            a store, or is newer than this code.
    """

    def __init__(self, path: str | Path | None = None, *, create: bool = True) -> None:
        self.path = Path(path) if path is not None else default_store_path()
        if not create and not self.path.exists():
            raise StoreError(f"no results store at {self.path}")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self.version = migrate(self._db)
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise StoreError(f"cannot open results store {self.path}: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ runs
    def create_run(
        self,
        run_id: str,
        *,
        spec: dict[str, Any],
        model: str = "",
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        device: str = "",
        versions: dict[str, str] | None = None,
        owner: str = "",
    ) -> None:
        """Add a run in state ``running``.

        Raises:
            StoreError: a run with that id exists.
        """
        now = _now()
        try:
            self._db.execute(
                "INSERT INTO runs (run_id, created_at, updated_at, state, owner, model, "
                "sampling, metadata, spec, device, versions) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    now,
                    now,
                    "running",
                    owner,
                    model,
                    json.dumps(sampling or {}),
                    json.dumps(metadata or {}),
                    json.dumps(spec),
                    device,
                    json.dumps(versions or {}),
                ),
            )
        except sqlite3.IntegrityError:
            raise StoreError(f"a run named {run_id!r} is already in {self.path}") from None

    def set_state(self, run_id: str, state: str, owner: str | None = None) -> None:
        """Set a run's state (and owner, when given)."""
        if owner is None:
            self._db.execute(
                "UPDATE runs SET state = ?, updated_at = ? WHERE run_id = ?",
                (state, _now(), run_id),
            )
        else:
            self._db.execute(
                "UPDATE runs SET state = ?, owner = ?, updated_at = ? WHERE run_id = ?",
                (state, owner, _now(), run_id),
            )

    def set_problems(self, run_id: str, problems: list[dict[str, Any]]) -> None:
        """Record (or update) the suite's problems: dicts with ``problem``, ``path``, ``level``,
        ``tags``, ``planned`` (pairs planned for it). A problem's planned count never goes
        down: an update with a lower one keeps the stored one (a pair once planned stays in
        the plan)."""
        with self._transaction():
            for p in problems:
                self._db.execute(
                    "INSERT INTO run_problems (run_id, problem, path, level, tags, planned) "
                    "VALUES (?,?,?,?,?,?) ON CONFLICT (run_id, problem) DO UPDATE SET "
                    "path = excluded.path, level = excluded.level, tags = excluded.tags, "
                    "planned = MAX(planned, excluded.planned)",
                    (
                        run_id,
                        p["problem"],
                        str(p.get("path", "")),
                        p.get("level"),
                        json.dumps(list(p.get("tags", ()))),
                        int(p.get("planned", 0)),
                    ),
                )

    def add_planned(self, run_id: str, pairs: list[tuple[str, str, str]]) -> None:
        """Add ``(problem, sample, candidate path)`` pairs to the run's plan (those already in
        it keep their first path) and raise each of their problems' planned count to the
        pairs planned for it; pairs are never taken out of a plan."""
        with self._transaction():
            self._db.executemany(
                "INSERT OR IGNORE INTO planned_pairs (run_id, problem, sample, path) "
                "VALUES (?,?,?,?)",
                [(run_id, problem, sample, path) for problem, sample, path in pairs],
            )
            for problem in {problem for problem, _, _ in pairs}:
                self._count_planned(run_id, problem)

    def planned(self, run_id: str) -> dict[tuple[str, str], str]:
        """The run's planned pairs, ``(problem, sample)`` -> the candidate file's path when it
        was planned, in the order they were planned (a judged pair is always planned)."""
        rows = self._db.execute(
            "SELECT problem, sample, path FROM planned_pairs WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        )
        return {(problem, sample): path for problem, sample, path in rows}

    def _count_planned(self, run_id: str, problem: str) -> None:
        self._db.execute(
            "UPDATE run_problems SET planned = MAX(planned, (SELECT COUNT(*) FROM planned_pairs "
            "WHERE run_id = ? AND problem = ?)) WHERE run_id = ? AND problem = ?",
            (run_id, problem, run_id, problem),
        )

    def problems(self, run_id: str) -> dict[str, tuple[int | None, tuple[str, ...]]]:
        """The run's problems -> ``(level, tags)``, in insertion order."""
        rows = self._db.execute(
            "SELECT problem, level, tags FROM run_problems WHERE run_id = ? ORDER BY rowid",
            (run_id,),
        )
        return {name: (level, tuple(json.loads(tags))) for name, level, tags in rows}

    def resolve(self, run: str) -> str:
        """A run id from its full id, a unique prefix, or ``latest``.

        Raises:
            StoreError: no run, or several, match.
        """
        if run == "latest":
            row = self._db.execute(
                "SELECT run_id FROM runs ORDER BY created_at DESC, rowid DESC LIMIT 1"
            ).fetchone()
            if row is None:
                raise StoreError(f"no runs in {self.path}")
            return str(row[0])
        exact = self._db.execute("SELECT run_id FROM runs WHERE run_id = ?", (run,)).fetchone()
        if exact:
            return str(exact[0])
        like = run.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\'", (like,)
        ).fetchall()
        if len(rows) == 1:
            return str(rows[0][0])
        if not rows:
            raise StoreError(f"no run {run!r} in {self.path} (see: kerneljudge results runs)")
        raise StoreError(f"{run!r} matches {len(rows)} runs: {', '.join(r[0] for r in rows)}")

    def has_run(self, run_id: str) -> bool:
        """Whether a run has exactly this id."""
        row = self._db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return row is not None

    def run(self, run: str) -> RunInfo:
        """One run by id, prefix or ``latest``. Raises StoreError when there is none."""
        return self._runs("WHERE r.run_id = ?", (self.resolve(run),))[0]

    def runs(self) -> list[RunInfo]:
        """Every run, oldest first."""
        return self._runs("", ())

    def _runs(self, where: str, args: tuple[Any, ...]) -> list[RunInfo]:
        sql = (
            "SELECT r.run_id, r.created_at, r.updated_at, r.state, r.owner, r.model, "
            "r.sampling, r.metadata, r.spec, r.device, r.versions, "
            "(SELECT COUNT(*) FROM run_problems p WHERE p.run_id = r.run_id), "
            "(SELECT COALESCE(SUM(planned), 0) FROM run_problems p WHERE p.run_id = r.run_id), "
            "(SELECT COUNT(*) FROM verdicts v WHERE v.run_id = r.run_id), "
            "(SELECT COUNT(*) FROM verdicts v WHERE v.run_id = r.run_id "
            "AND v.status = 'correct') "
            f"FROM runs r {where} ORDER BY r.created_at, r.rowid"
        )
        out = []
        for row in self._db.execute(sql, args):
            out.append(
                RunInfo(
                    run_id=row[0],
                    created_at=row[1],
                    updated_at=row[2],
                    state=row[3],
                    owner=row[4],
                    model=row[5],
                    sampling=json.loads(row[6]),
                    metadata=json.loads(row[7]),
                    spec=json.loads(row[8]),
                    device=row[9],
                    versions=json.loads(row[10]),
                    problems=row[11],
                    planned=row[12],
                    judged=row[13],
                    correct=row[14],
                )
            )
        return out

    # ------------------------------------------------------------------ verdicts
    def add_verdict(
        self,
        run_id: str,
        *,
        problem: str,
        sample: str,
        source: str,
        verdict: Verdict,
        level: int | None = None,
        tags: tuple[str, ...] | list[str] = (),
        candidate_path: str = "",
        transcript: list[Any] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> int:
        """Store one verdict (and its episode transcript, when it came from an episode) in one
        committed transaction, the pair joining the run's plan if it was not in it (so no run
        has more verdicts than planned pairs); return its row id.

        Raises:
            StoreError: the pair (run, problem, sample) already has a verdict.
        """
        data = verdict.to_dict()
        med, lo, hi = speedup_columns(data)
        try:
            with self._transaction():
                cur = self._db.execute(
                    "INSERT INTO verdicts (run_id, problem, level, tags, sample, candidate_path,"
                    " candidate_source, candidate_sha256, backend, status, verdict, device, "
                    "versions, started_at, finished_at, stored_at, speedup, speedup_lo, "
                    "speedup_hi) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        run_id,
                        problem,
                        level,
                        json.dumps(list(tags)),
                        sample,
                        candidate_path,
                        source,
                        hashlib.sha256(source.encode()).hexdigest(),
                        verdict.backend,
                        verdict.status.value,
                        json.dumps(data),
                        verdict.device.name if verdict.device else "",
                        json.dumps(verdict.versions),
                        verdict.started_at,
                        verdict.finished_at,
                        _now(),
                        med,
                        lo,
                        hi,
                    ),
                )
                vid = int(cur.lastrowid or 0)
                self._db.execute(
                    "INSERT OR IGNORE INTO planned_pairs (run_id, problem, sample, path) "
                    "VALUES (?,?,?,?)",
                    (run_id, problem, sample, candidate_path),
                )
                self._count_planned(run_id, problem)
                if transcript is not None:
                    self._db.execute(
                        "INSERT INTO episodes (verdict_id, transcript, summary, stored_at) "
                        "VALUES (?,?,?,?)",
                        (vid, json.dumps(transcript), json.dumps(summary), _now()),
                    )
        except sqlite3.IntegrityError as exc:
            raise StoreError(
                f"run {run_id}: {problem}/{sample} already has a verdict ({exc})"
            ) from None
        return vid

    def done(self, run_id: str) -> set[tuple[str, str]]:
        """The (problem, sample) pairs of a run that have a stored verdict."""
        rows = self._db.execute("SELECT problem, sample FROM verdicts WHERE run_id = ?", (run_id,))
        return {(p, s) for p, s in rows}

    def verdicts(self, run_id: str) -> Iterator[StoredVerdict]:
        """The run's verdicts in the order they were stored."""
        rows = self._db.execute(
            f"SELECT {_VERDICT_COLUMNS} FROM verdicts v LEFT JOIN episodes e "
            "ON e.verdict_id = v.id WHERE v.run_id = ? ORDER BY v.id",
            (run_id,),
        )
        for row in rows:
            yield StoredVerdict(
                id=row[0],
                run_id=row[1],
                problem=row[2],
                level=row[3],
                tags=tuple(json.loads(row[4])),
                sample=row[5],
                candidate_path=row[6],
                candidate_source=row[7],
                candidate_sha256=row[8],
                backend=row[9],
                status=row[10],
                verdict_json=row[11],
                device=row[12],
                versions=json.loads(row[13]),
                started_at=row[14],
                finished_at=row[15],
                stored_at=row[16],
                speedup=row[17],
                speedup_lo=row[18],
                speedup_hi=row[19],
                transcript=json.loads(row[20]) if row[20] is not None else None,
            )

    def samples(self, run_id: str, timing: str = "launched") -> list[Sample]:
        """The run's verdicts as :class:`~kerneljudge.suite.metrics.Sample` for the metrics,
        by ``timing``'s speedups (:meth:`StoredVerdict.as_sample`)."""
        return [v.as_sample(timing) for v in self.verdicts(run_id)]

    # ------------------------------------------------------------------ helpers
    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
