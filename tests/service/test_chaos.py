"""Chaos: a real server judges JOBS small jobs sent by CLIENTS concurrent clients while it is
killed with SIGKILL twice (once while jobs are being submitted, once while they are being
judged) and started again on the same database. Every job a client saw accepted ends with
exactly one verdict, none is lost or recorded twice, and no process of a killed server is
left behind."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from kerneljudge.executors.base import Job
from kerneljudge.service.client import JudgeClient, QueueFullError, ServiceError
from kerneljudge.verdict import Status, Verdict

from .conftest import CRASH, GOOD, TOKEN, WRONG, Server, smoke_job

#: Jobs in the run. The aim is 1,000: ``KERNELJUDGE_CHAOS_JOBS=1000`` took 730 s on a 2-core
#: machine (docs/benchmarks/2026-12-01-cpu-chaos-1000.md), and a loaded one judged 80 jobs in
#: 405 s; the default keeps this file near three minutes of a CI run.
JOBS = int(os.environ.get("KERNELJUDGE_CHAOS_JOBS", "32"))
CLIENTS = 8
#: Jobs per submit request: several requests per client, so the first kill lands among them.
BATCH = max(1, min(10, JOBS // (CLIENTS * 4)))
#: The whole run's limit, seconds.
DEADLINE_S = float(os.environ.get("KERNELJUDGE_CHAOS_DEADLINE_S", "3000"))
MARK = "KERNELJUDGE_CHAOS_MARK"


def _source(i: int) -> tuple[str, Status]:
    if i % 97 == 13:
        return CRASH, Status.RUNTIME_ERROR
    if i % 41 == 7:
        return WRONG, Status.INCORRECT
    return GOOD, Status.CORRECT


def _descendants(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every living descendant of ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add((child, starts[child]))
            todo.append(child)
    return out


def _marked(mark: str) -> set[int]:
    """Living processes whose environment carries ``MARK=mark`` (the server's own and every
    process it started that kept its environment)."""
    found = set()
    needle = f"{MARK}={mark}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.add(int(entry))
            except OSError:
                pass
    return found


def _alive(procs: set[tuple[int, str]]) -> set[int]:
    left = set()
    for pid, start in procs:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[19] == start and fields[0] != "Z":
            left.add(pid)
    return left


def _assert_nothing_left(procs: set[tuple[int, str]], mark: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (_alive(procs) or _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(procs), (
        f"processes of the killed server still run: {_describe(_alive(procs))}"
    )
    assert not _marked(mark), (
        f"processes of the killed server still run: {_describe(_marked(mark))}"
    )


def _describe(pids: set[int]) -> str:
    """Each process's pid, state, parent and command line (what a failure needs to name it)."""
    out = []
    for pid in sorted(pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        out.append(f"{pid} state {fields[0]} parent {fields[1]}: {cmd[:300]}")
    return "; ".join(out) or "(gone)"


class _Client(threading.Thread):
    """Submits its jobs in batches (the same batch again after a refusal or a dead server:
    job ids make it idempotent), then waits for every verdict."""

    def __init__(self, url: str, jobs: list[tuple[Job, Status]], stop_at: float) -> None:
        super().__init__(daemon=True)
        self.url, self.jobs, self.stop_at = url, jobs, stop_at
        self.accepted: set[str] = set()
        self.verdicts: dict[str, Verdict] = {}
        self.error: BaseException | None = None

    def _retry(self, call):  # type: ignore[no-untyped-def]
        while time.monotonic() < self.stop_at:
            try:
                return call()
            except QueueFullError as exc:
                time.sleep(min(exc.retry_after_s, 2.0))
            except ServiceError as exc:
                if exc.status not in (0, 502, 503):
                    raise
                time.sleep(0.5)  # the server is down: it comes back
        raise TimeoutError("the chaos run passed its deadline")

    def run(self) -> None:
        try:
            with JudgeClient(self.url, token=TOKEN, timeout_s=60) as client:
                for i in range(0, len(self.jobs), BATCH):
                    batch = [job for job, _ in self.jobs[i : i + BATCH]]
                    answer = self._retry(lambda b=batch: client.submit_batch(b))
                    self.accepted.update(s["job_id"] for s in answer)
                for job, _ in self.jobs:
                    while job.job_id not in self.verdicts:
                        try:
                            self.verdicts[job.job_id] = self._retry(
                                lambda j=job: client.result(j.job_id, wait=30.0)
                            )
                        except TimeoutError as exc:
                            if "is still" not in str(exc):  # the run's deadline
                                raise
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _done(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as con:
        return int(con.execute("SELECT COUNT(*) FROM jobs WHERE state='done'").fetchone()[0])


def test_sigkill_twice_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.sqlite"
    mark = os.urandom(8).hex()
    os.environ[MARK] = mark
    try:
        server = Server(db, ["--max-queued", str(JOBS), "--max-per-client", str(JOBS)])
        server.start()
    finally:
        del os.environ[MARK]
    stop_at = time.monotonic() + DEADLINE_S
    expected = {}
    shares: list[list[tuple[Job, Status]]] = [[] for _ in range(CLIENTS)]
    for i in range(JOBS):
        source, status = _source(i)
        job = smoke_job(source, job_id=f"chaos-{i:05d}")
        expected[job.job_id] = status
        shares[i % CLIENTS].append((job, status))
    clients = [_Client(server.url, share, stop_at) for share in shares]
    for c in clients:
        c.start()

    def kill_and_restart(when: str) -> None:
        assert server.proc is not None
        procs = _descendants(server.proc.pid)
        server.kill()
        _assert_nothing_left(procs, mark)
        os.environ[MARK] = mark
        try:
            server.start()
        finally:
            del os.environ[MARK]
        print(f"killed and restarted {when}: {len(procs)} processes ended with it")

    # First kill: while the clients are still submitting.
    while sum(len(c.accepted) for c in clients) < min(JOBS // 4, 100):
        assert time.monotonic() < stop_at
        time.sleep(0.05)
    kill_and_restart("while submitting")
    # Second kill: while jobs are being judged (some verdicts written, many to come).
    while _done(db) < max(2, JOBS // 3):
        assert time.monotonic() < stop_at and server.proc and server.proc.poll() is None
        time.sleep(0.2)
    kill_and_restart("while judging")
    for c in clients:
        c.join(max(1.0, stop_at - time.monotonic()))
    assert server.proc is not None
    procs = _descendants(server.proc.pid)
    server.stop()
    _assert_nothing_left(procs, mark)

    for c in clients:
        assert c.error is None, f"{type(c.error).__name__}: {c.error}"
        assert not c.is_alive(), "a client did not finish before the deadline"
    verdicts = {k: v for c in clients for k, v in c.verdicts.items()}
    assert set(verdicts) == set(expected) == {a for c in clients for a in c.accepted}
    wrong = {k: (v.status, expected[k]) for k, v in verdicts.items() if v.status != expected[k]}
    assert not wrong, f"{len(wrong)} verdicts unexpected, e.g. {list(wrong.items())[:3]}"
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT job_id, state, verdict_json, attempts FROM jobs").fetchall()
    assert len(rows) == JOBS and {r[0] for r in rows} == set(expected)
    assert all(state == "done" and verdict for _, state, verdict, _ in rows)
    rejudged = sum(attempts > 1 for *_, attempts in rows)
    print(f"{JOBS} jobs, {rejudged} judged again after a kill")
    for job_id, _, verdict_json, _ in rows:
        assert Verdict.from_json(verdict_json).status == expected[job_id]


def _wait_for_connection(port: int, timeout_s: float = 60.0) -> None:
    """Wait until a TCP connection to ``port`` on loopback is established (``/proc/net/tcp``,
    state 01), so a request sent from another thread has reached the server."""
    local = f"0100007F:{port:04X}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = [ln.split() for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        if any(r[1] == local and r[3] == "01" for r in rows):
            return
        time.sleep(0.05)
    raise AssertionError(f"no connection to port {port} in {timeout_s} s")


def test_sigterm_starts_no_job_answers_waiting_clients_and_counts_no_attempt(
    tmp_path: Path,
) -> None:
    """A clean stop while one job is judged (it hangs), one waits in the queue and a client
    waits for the queued one's result: the client is answered (202) before the server exits,
    the queued job never starts, and both are queued again with no attempt counted."""
    import dataclasses

    import httpx

    from .conftest import HANG

    db = tmp_path / "jobs.sqlite"
    server = Server(db, ["--cpu-slots", "1", "--max-in-flight", "1"]).start()
    hang = smoke_job(HANG, options=dataclasses.replace(smoke_job().options, run_timeout_s=120.0))
    queued = smoke_job()
    with JudgeClient(server.url, token=TOKEN) as client:
        client.submit(hang)
        client.submit(queued)
        deadline = time.monotonic() + 300
        while client.status(hang.job_id)["state"] != "running":
            assert time.monotonic() < deadline, "the hanging job never started"
            time.sleep(0.2)
    answer: list[httpx.Response] = []
    url = f"{server.url}/v1/jobs/{queued.job_id}/result?wait=60"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    poll = threading.Thread(target=lambda: answer.append(httpx.get(url, headers=auth, timeout=200)))
    poll.start()
    _wait_for_connection(server.port)
    time.sleep(1.0)  # the server has read the request and waits for the result
    assert server.proc is not None
    server.proc.terminate()
    poll.join(45)  # before the 60 s it asked to wait
    assert answer and answer[0].status_code == 202 and answer[0].json()["state"] == "queued"
    assert server.proc.wait(timeout=120) == 0
    with sqlite3.connect(db) as con:
        rows = dict(con.execute("SELECT job_id, state || ' ' || attempts FROM jobs").fetchall())
    assert rows == {hang.job_id: "queued 0", queued.job_id: "queued 0"}


@pytest.fixture(autouse=True)
def _no_marker_left() -> None:
    os.environ.pop(MARK, None)
