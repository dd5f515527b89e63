"""The job store on a real SQLite file, and the problem-path rule: what the service's
durability and its refusal of arbitrary paths rest on."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from kerneljudge.service.core import resolve_problem
from kerneljudge.service.store import JobConflict, JobStore, QueueFull

from .conftest import SMOKE, WRONG, smoke_job


def _add(store: JobStore, *jobs, client: str = "c", max_queued: int = 100):  # type: ignore[no-untyped-def]
    return store.add([(j, j.problem) for j in jobs], client, max_queued, max_queued)


def test_a_job_has_one_result_across_a_crash(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db)
    a, b, c = smoke_job(), smoke_job(), smoke_job()
    _add(store, a, b, c)
    assert store.claim_next().job_id == a.job_id  # type: ignore[union-attr]
    assert store.claim_next().job_id == b.job_id  # type: ignore[union-attr]
    assert store.finish(a.job_id, "done", verdict_json='{"status": "correct"}')
    assert not store.finish(a.job_id, "done", verdict_json='{"status": "incorrect"}')
    assert not store.finish(c.job_id, "failed", error="never handed out")
    store.close()  # as after SIGKILL: b is still "running"

    store = JobStore(db)
    assert store.requeue_running() == 1
    assert store.counts() == {"queued": 2, "running": 0, "done": 1, "failed": 0, "cancelled": 0}
    assert store.get(a.job_id).verdict_json == '{"status": "correct"}'  # type: ignore[union-attr]
    again = store.claim_next()
    assert again is not None and again.job_id == b.job_id and again.attempts == 2
    assert store.cancel_queued(c.job_id) and not store.cancel_queued(c.job_id)
    assert not store.cancel_queued(b.job_id)  # running
    assert store.claim_next() is None
    store.close()


def test_idempotent_ids_conflicts_and_limits(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = smoke_job()
    [(first, created)] = _add(store, job)
    assert created
    out = _add(store, job, job)
    assert [c for _, c in out] == [False, False]
    assert out[0][0].submitted_at == first.submitted_at
    with pytest.raises(JobConflict):
        _add(store, smoke_job(WRONG, job_id=job.job_id))
    with pytest.raises(QueueFull):
        _add(store, smoke_job(), smoke_job(), max_queued=2)
    with pytest.raises(QueueFull, match="this client has 1 jobs queued"):
        store.add([(smoke_job(), "p")], "c", 100, 1)
    store.add([(smoke_job(), "p")], "other", 100, 1)
    assert store.counts()["queued"] == 2  # the refused batches left nothing behind
    store.close()


def test_one_store_per_file_and_the_schema_version(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    store = JobStore(db)
    store.counts()  # SQLite holds its shared-memory and file locks now

    def posix_locks() -> list[str]:  # this process's fcntl locks on the file (SQLite's)
        st = db.stat()
        file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        rows = [ln.split() for ln in Path("/proc/locks").read_text().splitlines()]
        mine = ["POSIX", "ADVISORY"], [str(os.getpid()), file]
        return [" ".join(r) for r in rows if (r[1:3], r[4:6]) == mine]

    held = posix_locks()
    with pytest.raises(RuntimeError, match="in use by another kerneljudge service"):
        JobStore(db)
    (tmp_path / "alias").mkdir()
    (tmp_path / "alias" / "jobs.sqlite").symlink_to(db)
    (tmp_path / "hard.sqlite").hardlink_to(db)
    for other in (tmp_path / "alias" / "jobs.sqlite", tmp_path / "hard.sqlite"):
        with pytest.raises(RuntimeError, match="in use by another kerneljudge service"):
            JobStore(other)  # the same file by another name
    assert posix_locks() == held  # the refusals closed no descriptor of SQLite's file
    store.close()
    JobStore(tmp_path / "alias" / "jobs.sqlite").close()  # free again once the first closed
    with sqlite3.connect(db) as con:
        con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(RuntimeError, match="schema version 99"):
        JobStore(db)
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_problems_are_bundled_names_or_files_inside_the_folder(tmp_path: Path) -> None:
    assert resolve_problem("causal_gqa", None) == "causal_gqa"
    assert resolve_problem("problem.py", SMOKE) == str(SMOKE / "problem.py")
    (tmp_path / "inside.py").write_text("")
    (tmp_path / "escape.py").symlink_to(SMOKE / "problem.py")
    assert resolve_problem("inside.py", tmp_path) == str(tmp_path / "inside.py")
    for spec, folder in [
        ("problem.py", None),
        (str(SMOKE / "problem.py"), SMOKE),
        ("../smoke/candidate.txt", SMOKE),
        ("../../conftest.py", SMOKE),
        ("escape.py", tmp_path),
        ("~/x.py", tmp_path),
        ("missing.py", tmp_path),
    ]:
        with pytest.raises(ValueError, match="bundled problem name"):
            resolve_problem(spec, folder)


def test_a_job_running_at_every_stop_fails_instead_of_crash_looping(tmp_path: Path) -> None:
    from kerneljudge.service.store import MAX_ATTEMPTS

    db = tmp_path / "jobs.sqlite"
    poison, other = smoke_job(), smoke_job()
    store = JobStore(db)
    _add(store, poison, other)
    for stop in range(1, MAX_ATTEMPTS + 1):
        record = store.claim_next()
        assert record is not None and record.job_id == poison.job_id
        assert record.attempts == stop
        store.close()  # the service dies while judging it
        store = JobStore(db)
        store.requeue_running()
    record = store.get(poison.job_id)
    assert record is not None and record.state == "failed"
    assert record.error == f"the service stopped while judging this job {MAX_ATTEMPTS} times"
    nxt = store.claim_next()
    assert nxt is not None and nxt.job_id == other.job_id  # the queue goes on
    store.close()


def test_a_clean_stop_gives_the_attempt_back(tmp_path: Path) -> None:
    from kerneljudge.service.store import MAX_ATTEMPTS

    store = JobStore(tmp_path / "jobs.sqlite")
    job = smoke_job()
    _add(store, job)
    for _ in range(MAX_ATTEMPTS + 2):  # more clean stops than a crash may have
        record = store.claim_next()
        assert record is not None and record.attempts == 1
        assert store.requeue_running(clean_stop=True) == 1
    record = store.get(job.job_id)
    assert record is not None and record.state == "queued" and record.attempts == 0
    store.close()


def test_admission_caps_options_and_refuses_unencodable_sources(tmp_path: Path) -> None:
    from kerneljudge.service.core import Limits, parse_job

    limits = Limits()
    base = smoke_job().to_dict()
    base["problem"] = "softmax_long_row"

    def refused(**change: object) -> str:
        data = {**base, **change}
        with pytest.raises(ValueError) as info:
            parse_job(data, None, limits)
        return str(info.value)

    parse_job(dict(base), None, limits)  # the base job is accepted
    assert "trials is at most" in refused(options={"trials": limits.max_trials + 1})
    assert "run_timeout_s is at most" in refused(options={"run_timeout_s": float("inf")})
    assert "max_time_s is at most" in refused(options={"max_time_s": 1e9})
    assert "lone surrogate" in refused(source="x = '\udc80'")
    # A name too long for the file system is a refusal, not an OSError.
    assert "problems folder" in str(
        pytest.raises(ValueError, resolve_problem, "a" * 300 + ".py", tmp_path).value
    )


def test_the_rate_of_the_last_minute_counts_only_this_service_s_life(tmp_path: Path) -> None:
    import time

    from kerneljudge.executors.local import LocalExecutor
    from kerneljudge.service.core import JudgeService

    store = JobStore(tmp_path / "jobs.sqlite")
    service = JudgeService(store, lambda: LocalExecutor(devices=[], cpu_slots=1))
    jobs = [smoke_job() for _ in range(3)]
    _add(store, *jobs)
    for job in jobs:
        store.claim_next()
        store.finish(job.job_id, "done", verdict_json="{}")
    service.started_at = time.time() - 6.0  # up 6 s: 3 verdicts in 6 s, not in 60
    assert 0.45 <= service.rate_1m() <= 0.5
    service.started_at = time.time() - 600.0
    assert service.rate_1m() == pytest.approx(3 / 60)
    store.close()
