"""SIGTERM (``kill PID``) and SIGHUP (the terminal closed) stop a suite run as Ctrl-C does: the
run is marked ``interrupted``, the command says how to continue and exits 128 + the signal (143,
129), and a resume judges the rest, each pair once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kerneljudge.suite.store import ResultsStore

from .small_suite import write_candidate, write_suite
from .test_suite_run import _start

REPO = Path(__file__).resolve().parents[2]
SAMPLES = ("a", "b", "c", "d", "e", "f")


def _finish(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=600)  # a liveness bound on a loaded machine, not a speed check
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["sigterm", "sighup"]
)
def test_sigterm_interrupts_the_run_cleanly_and_a_resume_finishes_it(
    signum: int, status: int, tmp_path: Path
) -> None:
    suite = write_suite(tmp_path)
    cands = tmp_path / "cands"
    for sample in SAMPLES:
        write_candidate(cands, sample)
    db = tmp_path / "r.db"
    common = ["--store", str(db)]
    log = tmp_path / "1.log"
    proc = _start(
        [str(suite), "-c", str(cands), "--run-id", "t", "--device", "cpu", "--trials", "1",
         "--no-timing", *common],
        log,
    )  # fmt: skip
    deadline = time.monotonic() + 600  # a liveness bound, not a speed check
    while "run t (store" not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} early:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    proc.send_signal(signum)  # the process alone, as ``kill PID`` does
    assert _finish(proc) == status, log.read_text()
    assert f"interrupted: continue with  kerneljudge suite run --resume t --store {db}" in (
        log.read_text()
    )
    with ResultsStore(db) as store:
        info = store.run("t")
        assert info.state == "interrupted" and info.judged < len(SAMPLES)
        before = [(r.id, r.sample) for r in store.verdicts("t")]

    log2 = tmp_path / "2.log"
    assert _finish(_start(["--resume", "t", *common], log2)) == 0, log2.read_text()
    with ResultsStore(db) as store:
        rows = [(r.id, r.sample) for r in store.verdicts("t")]
        info = store.run("t")
    assert rows[: len(before)] == before
    assert sorted(s for _, s in rows) == list(SAMPLES)  # each exactly once
    assert (info.state, info.judged, info.planned) == ("finished", 6, 6)


def test_a_run_stopped_before_it_was_taken_is_marked_interrupted(tmp_path: Path) -> None:
    """:func:`release` marks a run ``interrupted`` where this process left it ``running``
    (stopped while it was planned), and leaves another process's run alone."""
    from kerneljudge.suite.runner import release, start_run

    suite = write_suite(tmp_path)
    write_candidate(tmp_path / "cands", "a")
    with ResultsStore(tmp_path / "r.db") as store:
        run = start_run(store, suite=[str(suite)], candidates=tmp_path / "cands")
        store.create_run("other", spec={}, owner="elsewhere:1")
        assert store.run(run).state == store.run("other").state == "running"
        release(store, run)
        release(store, "other")
        assert (store.run(run).state, store.run("other").state) == ("interrupted", "running")
