"""SIGINT (Ctrl-C), SIGTERM and SIGHUP on ``kerneljudge episode``: the run stops without
waiting for its episodes in flight, marks them interrupted as ``--resume`` expects (naming the
signal), ends its workers, removes its temporary folder, says how to continue and exits
128 + the signal. A real runner process against the loopback server (fake_server.py), real
judges on the smoke problem."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_server import FakeServer, Hang, Reply, by_turn
from test_durable_runs import _processes_in

from kerneljudge.agent.runlog import RunLog, read_jsonl

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "tests" / "fixtures" / "smoke" / "problem.py"
GOOD = {"kernel_code": (REPO / "tests" / "fixtures" / "smoke" / "candidate.py").read_text()}


def _episode(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "kerneljudge", "episode", "--json", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _wait_for_partial(proc: subprocess.Popen[str], log: RunLog, count: int) -> None:
    """Wait until ``count`` episodes have made a tool call and wait for their model."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-3000:])
        if log.plan_path.exists() and log.state_path.exists():
            if sum(s.state == "partial" for s in log.states()) >= count:
                return
        time.sleep(0.05)
    raise AssertionError("the episodes did not get there")


@pytest.mark.parametrize(
    ("signum", "status", "group", "resume"),
    [
        (signal.SIGINT, 130, True, True),
        (signal.SIGTERM, 143, False, False),
        (signal.SIGHUP, 129, False, False),
    ],
    ids=["sigint", "sigterm", "sighup"],
)
def test_a_signal_stops_the_run_at_once_and_it_can_be_resumed(
    signum: int, status: int, group: bool, resume: bool, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    log = RunLog(out)
    # a run_correctness (the judges' workers are up), then a model that never answers
    first_run = by_turn([Reply("", [("run_correctness", GOOD)]), Hang(3600.0)])
    resumed = by_turn([Reply("Submitting.", [("submit_kernel", GOOD)])])
    answers = {"policy": first_run}

    def policy(body: dict[str, Any]) -> Any:
        return answers["policy"](body)

    with FakeServer(policy) as server:
        args = ["--model", "scripted", "--base-url", server.base_url]
        first = _episode(
            *args,
            *("-p", str(SMOKE), "--episodes", "3", "--concurrency", "2", "--out", str(out)),
            *("--device", "cpu", "--cache-dir", str(tmp_path / "cache"), "--no-profile"),
            *("--baselines", "eager", "--trials", "1", "--submit-trials", "1"),
            *("--benchmark-time", "0.05", "--submit-time", "0.05"),
            *("--request-timeout", "3600", "--max-retries", "0"),
        )
        _wait_for_partial(first, log, 2)
        (tmp,) = [r["tmp"] for r in log.run_records()]
        assert _processes_in([tmp])  # the run's workers
        if group:  # Ctrl-C in a terminal: the whole foreground process group
            os.killpg(first.pid, signum)
        else:  # what timeout, systemd and docker send: the runner alone
            os.kill(first.pid, signum)
        # far less than the model's hour: the episodes in flight were not waited for
        stdout, stderr = first.communicate(timeout=120)
        assert first.returncode == status, stderr[-3000:]
        assert stderr.strip().splitlines()[-1] == (
            f"interrupted: continue with kerneljudge episode --resume {out}"
        )
        assert "Traceback" not in stderr and stdout == ""
        assert not Path(tmp).exists()
        deadline = time.monotonic() + 60  # a killed process leaves /proc when it is reaped
        while _processes_in([tmp]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_in([tmp]) == []

        states = log.states()
        assert [s.state for s in states] == ["planned"] * 3  # all left to run
        events = read_jsonl(out / "state.jsonl")
        marked = [e for e in events if e["event"] == "interrupted"]
        assert len(marked) == 2 and all(e["steps"] == 1 for e in marked)
        for e in marked:
            records = read_jsonl(out / e["transcript"])
            assert e["transcript"].endswith(".interrupted.jsonl")
            assert records[0]["type"] == "episode" and records[-1]["type"] == "interrupted"
            assert f"({signal.Signals(signum).name})" in records[-1]["reason"]
            assert [r["type"] for r in records].count("tool") == 1
        kept = sorted(p.name for p in (out / "smoke_affine").iterdir())
        assert kept == sorted(Path(e["transcript"]).name for e in marked)  # none stray
        assert not (out / "summary.jsonl").exists()
        assert events[-1]["event"] == "run_end"

        if not resume:
            return
        answers["policy"] = resumed
        second = _episode(*args, "--resume", str(out))
        stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 0, stderr[-3000:]
    lines = read_jsonl(out / "summary.jsonl")
    assert len(lines) == 3 and all(line["stop_reason"] == "submitted" for line in lines)
    assert len(list(out.glob("smoke_affine/*.interrupted.jsonl"))) == 2
    assert [r["concurrency"] for r in log.run_records()] == [2, 2]
    assert sum(1 for r in server.requests if r["messages"][-1]["role"] == "tool") == 2
