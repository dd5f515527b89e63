"""Retention of finished jobs, on a real SQLite file and through a real ``kerneljudge serve``:
what is deleted (expired results, the oldest fetched ones over the bound), what never is
(queued and running jobs, results nobody fetched within the retention period), the answer for
a deleted job, and the migration of a database written by schema version 1."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from kerneljudge.service.store import TOMBSTONE_MIN_S, JobStore, QueueFull

from .conftest import GOOD, WRONG, Server, httpx, smoke_job

#: Seconds to wait for a job's verdict or for a sweep on this loaded machine.
WAIT_S = 300.0
DAY = 86400.0


def _add(store: JobStore, *jobs, client: str = "c", unfetched: int | None = None):  # type: ignore[no-untyped-def]
    return store.add([(j, j.problem) for j in jobs], client, 100, 100, max_unfetched=unfetched)


def _finish(store: JobStore, n: int) -> list[int]:
    """Hand out and finish the next ``n`` queued jobs (oldest first); their seqs."""
    seqs = []
    for _ in range(n):
        record = store.claim_next()
        assert record is not None
        assert store.finish(record.seq, "done", verdict_json='{"status": "correct"}')
        seqs.append(record.seq)
    return seqs


def test_expired_results_go_pending_jobs_stay(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    done, running, queued = smoke_job(), smoke_job(), smoke_job()
    _add(store, done, running, queued)
    _finish(store, 1)
    assert store.claim_next().job_id == running.job_id  # type: ignore[union-attr]
    # Within the retention period nothing goes, fetched or not.
    assert store.prune(retention_s=DAY, max_finished=10) == (0, 0)
    assert store.get(done.job_id, "c") is not None
    # A day later (seen from the store's side: ``now`` moved on) the result has expired.
    later = time.time() + 2 * DAY
    assert store.prune(retention_s=DAY, max_finished=10, now=later) == (1, 0)
    assert store.get(done.job_id, "c") is None
    assert store.expired(done.job_id, "c") == pytest.approx(later)
    assert store.expired(done.job_id, "someone-else") is None
    assert store.counts() == {"queued": 1, "running": 1, "done": 0, "failed": 0, "cancelled": 0}
    assert store.deleted_total() == 1
    # Long after, the tombstone goes too: the id is unknown.
    much_later = later + max(DAY, TOMBSTONE_MIN_S) + 1
    store.prune(retention_s=DAY, max_finished=10, now=much_later)
    assert store.expired(done.job_id, "c") is None
    store.close()


def test_the_bound_deletes_fetched_results_oldest_first_never_unfetched(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    jobs = [smoke_job() for _ in range(5)]
    _add(store, *jobs)
    seqs = _finish(store, 5)
    for seq in seqs[:3]:
        assert store.mark_fetched(seq)
    assert not store.mark_fetched(seqs[0])  # the first read only
    # Bound 4, 5 finished: the oldest fetched one goes.
    assert store.prune(retention_s=DAY, max_finished=4) == (0, 1)
    assert store.get(jobs[0].job_id, "c") is None and store.expired(jobs[0].job_id, "c")
    assert [r.job_id for r in store.all_records()] == [j.job_id for j in jobs[1:]]
    # Bound 1: the two other fetched ones go; the two unfetched results stay over the bound.
    assert store.prune(retention_s=DAY, max_finished=1) == (0, 2)
    assert [r.job_id for r in store.all_records()] == [j.job_id for j in jobs[3:]]
    assert store.deleted_total() == 3
    # Tombstones are bounded too: the newest one is kept.
    kept = [j.job_id for j in jobs[:3] if store.expired(j.job_id, "c") is not None]
    assert len(kept) == 1 and kept != [jobs[0].job_id]
    # ... until their retention period is over.
    assert store.prune(retention_s=DAY, max_finished=1, now=time.time() + 2 * DAY) == (2, 0)
    assert store.all_records() == []
    store.close()


def test_admission_keeps_unfetched_results_within_the_bound(tmp_path: Path) -> None:
    """A bound of 4 pending or unread jobs: 2 (half) for one client, 4 for all."""
    store = JobStore(tmp_path / "jobs.sqlite")
    a, b = smoke_job(), smoke_job()
    _add(store, a, b, unfetched=4)
    with pytest.raises(QueueFull, match="not fetched yet"):
        _add(store, smoke_job(), unfetched=4)  # two of this client's pending already
    [seq_a, _] = _finish(store, 2)
    with pytest.raises(QueueFull, match="not fetched yet"):
        _add(store, smoke_job(), unfetched=4)  # two of its results wait to be read
    _add(store, smoke_job(), smoke_job(), client="d", unfetched=4)  # the other half: another's
    with pytest.raises(QueueFull, match="at most 4"):
        _add(store, smoke_job(), client="e", unfetched=4)  # all four taken
    assert store.mark_fetched(seq_a)
    [(_, created)] = _add(store, smoke_job(), unfetched=4)
    assert created
    assert _add(store, a, unfetched=4)[0][1] is False  # a repeat takes no room
    store.close()


def test_an_expired_id_may_name_a_new_job(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = smoke_job()
    _add(store, job)
    _finish(store, 1)
    store.prune(retention_s=1.0, max_finished=10, now=time.time() + 10.0)
    assert store.expired(job.job_id, "c") is not None
    [(record, created)] = _add(store, smoke_job(WRONG, job_id=job.job_id))
    assert created and record.state == "queued"
    assert store.expired(job.job_id, "c") is None
    store.close()


# The layout version 1 of the store wrote (kerneljudge's first service release), verbatim.
_SCHEMA_V1 = """
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


def _write_v1(db: Path) -> dict[str, str]:
    """A version 1 database as version 1's store wrote it (its DDL, its INSERT and UPDATE
    statements, WAL): three finished jobs of a token client, a running and a queued one of
    a peer address, and a last job deleted by hand (the sequence is ahead of the rows).
    Returns job id -> state."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("BEGIN IMMEDIATE")
    for stmt in filter(str.strip, _SCHEMA_V1.split(";")):
        con.execute(stmt)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", ("1",))
    con.execute("COMMIT")
    states = {"done": "token:0123456789abcdef", "failed": "token:0123456789abcdef"}
    states |= {"cancelled": "token:0123456789abcdef", "running": "peer:127.0.0.1"}
    states |= {"queued": "peer:127.0.0.1", "gone": "peer:127.0.0.1"}
    now = time.time()
    for state, client in states.items():
        job = smoke_job(GOOD + f"# {state}\n", job_id=f"v1-{state}")
        con.execute(
            "INSERT INTO jobs (job_id, client, state, problem, source_sha256, "
            "job_json, submitted_at) VALUES (?, ?, 'queued', ?, ?, ?, ?)",
            (job.job_id, client, job.problem, job.source_sha256, json.dumps(job.to_dict()), now),
        )
    for state in ("done", "failed", "running"):
        con.execute(
            "UPDATE jobs SET state='running', started_at=?, attempts=attempts+1 "
            "WHERE job_id=? AND state='queued'",
            (now, f"v1-{state}"),
        )
    con.execute(
        "UPDATE jobs SET state=?, verdict_json=?, error_kind=?, error=?, finished_at=? "
        "WHERE job_id=? AND state='running'",
        ("done", '{"status": "correct"}', None, None, now, "v1-done"),
    )
    con.execute(
        "UPDATE jobs SET state=?, verdict_json=?, error_kind=?, error=?, finished_at=? "
        "WHERE job_id=? AND state='running'",
        ("failed", None, "problem", "no problem named x", now, "v1-failed"),
    )
    con.execute(
        "UPDATE jobs SET state='cancelled', error_kind='cancelled', "
        "error='cancelled before it started', finished_at=? WHERE job_id=? AND state='queued'",
        (now, "v1-cancelled"),
    )
    con.execute("DELETE FROM jobs WHERE job_id='v1-gone'")
    con.close()
    del states["gone"]
    return {f"v1-{state}": state for state in states}


def test_a_version_1_database_is_migrated_keeping_every_job(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    states = _write_v1(db)
    before = sqlite3.connect(db).execute("SELECT seq, job_id, verdict_json FROM jobs").fetchall()

    store = JobStore(db)
    assert store.opened_version == 1
    records = store.all_records()
    assert [(r.seq, r.job_id, r.verdict_json) for r in records] == before
    assert {r.job_id: r.state for r in records} == states
    token, anonymous = "token:0123456789abcdef", "name:anonymous"
    assert {r.job_id: r.client for r in records} == {
        "v1-done": token,
        "v1-failed": token,
        "v1-cancelled": token,
        "v1-running": anonymous,  # the no-token client of version 1 (loopback)
        "v1-queued": anonymous,
    }
    # Finished jobs count as fetched (version 1 did not record reads); pending ones do not.
    assert {r.job_id for r in records if r.fetched_at is not None} == {
        "v1-done",
        "v1-failed",
        "v1-cancelled",
    }
    done = store.get("v1-done", token)
    assert done is not None and done.job().source == GOOD + "# done\n"
    # The store works on: the crashed job is queued again, the queue is served in order,
    # new seqs come after every seq version 1 handed out (the deleted job's included).
    assert store.requeue_running() == 1
    assert store.claim_next().job_id == "v1-running"  # type: ignore[union-attr]
    [(new, _)] = store.add([(smoke_job(job_id="v1-done"), "problem.py")], anonymous, 100, 100)
    assert new.seq == 7 and new.client == anonymous  # an id of version 1 is per client now
    assert store.prune(retention_s=DAY, max_finished=1) == (0, 2)
    store.close()

    store = JobStore(db)  # opened again: nothing left to migrate
    assert store.opened_version == 2
    assert store.deleted_total() == 2
    store.close()
    with sqlite3.connect(db) as con:
        version = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == ("2",)


def test_served_results_expire_and_say_so(tmp_path: Path) -> None:
    """A real server with a retention of 18 s and a bound of 4 finished jobs (2 for one
    client)."""
    args = ["--cpu-slots", "1", "--max-in-flight", "1"]
    args += ["--retention-hours", "0.005", "--max-finished-jobs", "4"]
    srv = Server(tmp_path / "jobs.sqlite", args, token=None).start()
    try:
        http = httpx.Client(base_url=srv.url, timeout=WAIT_S + 30)
        first, second = smoke_job(), smoke_job(WRONG)
        for job in (first, second):
            assert http.post("/v1/jobs", json=job.to_dict()).status_code == 202
        # Two of this client's jobs pending (then two results it did not read): no room for a
        # third of its own (half the bound).
        third = smoke_job()
        answer = http.post("/v1/jobs", json=third.to_dict())
        assert answer.status_code == 429 and "not fetched yet" in answer.json()["detail"]
        got = http.get(f"/v1/jobs/{first.job_id}/result", params={"wait": 60})
        while got.status_code == 202:
            got = http.get(f"/v1/jobs/{first.job_id}/result", params={"wait": 60})
        assert got.status_code == 200 and got.json()["verdict"]["status"] == "correct"
        # The first result was read: its room is free.
        assert http.post("/v1/jobs", json=third.to_dict()).status_code == 202
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            status = http.get(f"/v1/jobs/{first.job_id}")
            if status.status_code == 404:
                break
            time.sleep(0.5)
        assert status.status_code == 404, status.text
        assert "expired" in status.json()["detail"]
        unknown = http.get("/v1/jobs/never-submitted")
        assert unknown.status_code == 404 and "expired" not in unknown.json()["detail"]
        retention = http.get("/v1/metrics").json()["retention"]
        assert retention["deleted_total"] >= 1 and retention["max_finished_jobs"] == 4
        assert retention["deleted_expired"] + retention["deleted_over_cap"] >= 1
    finally:
        srv.stop()
    # After a restart the tombstone still answers "expired".
    srv = Server(tmp_path / "jobs.sqlite", args, token=None).start()
    try:
        status = httpx.get(f"{srv.url}/v1/jobs/{first.job_id}", timeout=60)
        assert status.status_code == 404 and "expired" in status.json()["detail"]
    finally:
        srv.stop()
