"""The judging process's own memory: bounded by a small multiple of one trial's output, and a
problem whose trials it cannot relay within its budget is a one-line error, not a crash."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from kerneljudge import Judge, JudgeConfig
from kerneljudge.errors import ProblemError

SRC = Path(__file__).resolve().parents[1] / "src"

PROBLEM = """
import torch
import torch.nn as nn

N = {n}


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
"""

CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5
"""

# One verdict in a fresh process: its peak resident memory (VmHWM, the high-water mark of its
# own address space: ru_maxrss would keep the forking test process's size across exec) above
# its resident memory just before the Judge was made (torch imported).
CHILD = """
import json, sys
from kerneljudge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

def rss(field="VmRSS"):
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(field))

problem, candidate, cache = sys.argv[1:4]
config = JudgeConfig(device="cpu", baselines=("eager",), cache_dir=cache,
                     timing_config=TimingConfig(max_time_s=0.5))
base = rss()
with Judge(problem, config) as judge:
    verdict = judge.evaluate(candidate)
peak = rss("VmHWM")
print(json.dumps({"status": verdict.status.value, "reason": verdict.reason,
                  "above": peak - base}))
"""


def _files(tmp_path: Path, mib: int) -> tuple[Path, Path]:
    problem, candidate = tmp_path / "elementwise.py", tmp_path / "candidate.py"
    problem.write_text(textwrap.dedent(PROBLEM.format(n=(mib << 20) // 4)))
    candidate.write_text(textwrap.dedent(CANDIDATE))
    return problem, candidate


def test_the_judge_holds_a_small_multiple_of_one_trials_output(tmp_path: Path) -> None:
    """A verdict with timing and its audit, on a 16 MiB output: the judging process peaked at
    644 MiB above its base (40x) when it kept every trial's inputs, outputs and oracle, and at
    67 MiB (4.2x, most of it a fixed cost) relaying one trial at a time
    (benchmarks/supervisor_memory.py). The bound leaves room for allocator slack."""
    out_bytes = 16 << 20
    problem, candidate = _files(tmp_path, 16)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(problem), str(candidate), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["status"] == "correct", got["reason"]
    assert got["above"] < 8 * out_bytes + (64 << 20), f"{got['above'] / 2**20:.0f} MiB"


def test_trials_beyond_the_memory_budget_are_a_one_line_problem_error(tmp_path: Path) -> None:
    """A 4 MiB input needs 8 MiB to relay (the message and its copy): a 4 MiB budget is
    refused before the candidate's first trial, with the sizes in the message."""
    problem, candidate = _files(tmp_path, 4)
    config = JudgeConfig(device="cpu", timing=False, memory_budget_mib=4, cache_dir=tmp_path)
    with Judge(problem, config) as judge:
        with pytest.raises(ProblemError) as info:
            judge.evaluate(candidate)
    message = str(info.value)
    assert "\n" not in message
    assert "inputs (4 MiB) need 8 MiB" in message and "memory budget of 4 MiB" in message
    with Judge(problem, JudgeConfig(device="cpu", timing=False, cache_dir=tmp_path)) as judge:
        assert judge.evaluate(candidate).status.value == "correct"  # the host's memory suffices


def test_a_candidate_reply_beyond_what_the_judge_relays_is_a_runtime_error(
    tmp_path: Path,
) -> None:
    """A candidate that returns 64 MiB where the reference returns 1 MiB: the reference worker
    reads no more than twice the reference's outputs plus 1 MiB, and stops at the announced
    length."""
    problem, _ = _files(tmp_path, 1)
    candidate = tmp_path / "huge.py"
    candidate.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.zeros(16 << 20)\n"
    )
    config = JudgeConfig(device="cpu", timing=False, memory_budget_mib=16, cache_dir=tmp_path)
    with Judge(problem, config) as judge:
        verdict = judge.evaluate(candidate)
    assert verdict.status.value == "runtime_error", verdict.reason
    assert verdict.reason == (
        "the outputs did not reach the reference worker: its outputs of 64 MiB exceed the "
        "3 MiB the judge reads"
    )


COUNTING = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        return torch.tanh(x) * (0.5 if ModelNew.calls == 1 else 0.25)
"""


def _prepared_by(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The preparations the reference side makes (on its thread), copied as they are returned
    (the trial loop replaces a deferred trial in its list once it ran)."""
    from kerneljudge.judge.reference_side import ReferenceSide

    made: list[dict] = []
    prepare = ReferenceSide.prepare

    def spied(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        prepared = prepare(self, *args, **kwargs)
        made.append({k: list(v) for k, v in prepared.items()})
        return prepared

    monkeypatch.setattr(ReferenceSide, "prepare", spied)
    return made


def test_trials_without_room_to_keep_are_run_when_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference worker allowed 1 byte of kept trials keeps the first and says it has no
    room for another: the others are deferred, run by the reference when the candidate's are
    compared; the verdict is the same (timed, its audits rebuilt from the held inputs), and a
    candidate wrong from its second call on is caught at a deferred trial."""
    made = _prepared_by(monkeypatch)
    problem, candidate = _files(tmp_path, 1)
    from kerneljudge.timing import TimingConfig

    config = JudgeConfig(
        device="cpu",
        baselines=("eager",),
        cache_dir=tmp_path,
        seed=3,
        timing_config=TimingConfig(max_time_s=0.3),
    )
    with Judge(problem, config) as judge:
        judge.reference.keep_bytes = 1
        verdict = judge.evaluate(candidate)
        assert verdict.status.value == "correct", verdict.reason
        assert verdict.timing is not None and verdict.check is not None
        assert len(verdict.check.trials) == config.trials
        (held,) = made[0].values()
        assert [h.deferred for h in held] == [False] + [True] * (config.trials - 1)
        assert held[0].reply["room"] is False
        n = config.trials
        deferred = (
            f"{n - 1} of {n} trials were deferred: the reference runs them only when the "
            "candidate's are compared (no room to keep them ahead)"
        )
        assert verdict.reductions == (deferred,)
        counting = tmp_path / "counting.py"
        counting.write_text(COUNTING)
        wrong = judge.evaluate(counting)
    assert wrong.status.value == "incorrect", wrong.reason
    assert wrong.reductions == (deferred,)  # said of a verdict that ended at its trials too
    assert "trial 1" in wrong.reason and wrong.check is not None
    assert wrong.check.n_passed == 1
    with Judge(problem, JudgeConfig(device="cpu", timing=False, cache_dir=tmp_path)) as judge:
        made.clear()
        roomy = judge.evaluate(candidate)
        assert roomy.status.value == "correct" and roomy.reductions == ()
        (held,) = made[0].values()
        assert not any(h.deferred for h in held)  # the host's share holds all five


def test_a_deferred_trials_failed_reference_run_is_named_in_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference worker dies (killed from outside, as the OOM killer would) on its run of
    a deferred trial, the candidate's worker beside it: a runtime_error whose reason names the
    deferred trial (the candidate ran beside the reference), and the next verdict, with a
    fresh reference worker, is correct."""
    from kerneljudge.check.reference import ReferenceSession

    run_trial = ReferenceSession.run_trial
    killed: list[str] = []

    def dies_once(self, key, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(key) == "1" and not killed:  # trial 2, the first deferred one
            killed.append(str(key))
            self.worker.kill()
        return run_trial(self, key, *args, **kwargs)

    monkeypatch.setattr(ReferenceSession, "run_trial", dies_once)
    problem, candidate = _files(tmp_path, 1)
    config = JudgeConfig(device="cpu", timing=False, cache_dir=tmp_path, seed=5)
    with Judge(problem, config) as judge:
        judge.reference.keep_bytes = 1
        failed = judge.evaluate(candidate)
        assert killed == ["1"]
        assert failed.status.value == "runtime_error"
        assert "trial 2, deferred" in failed.reason and "\n" not in failed.reason
        verdict = judge.evaluate(candidate)
    assert verdict.status.value == "correct", verdict.reason


def test_oracles_made_on_the_host_are_counted_and_named() -> None:
    """A float64 oracle whose device try fails is made on the host, and its tries say why
    (here a CUDA device on a machine without one: failed, not out of memory; on a machine with
    a GPU the device's try succeeds); the supervisor counts the audits of timed calls whose
    reply says ``oracle_on_host``, and a verdict's reductions, read when it is written, name
    deferred trials, trials and audits whose oracle was made on the host, one line each."""
    import types

    import torch

    from kerneljudge.check.reference import HeldTrial, ReferenceSession
    from kerneljudge.judge.outcome import Reductions
    from kerneljudge.verdict import Status, Verdict
    from kerneljudge.verdict.render import render_verdict
    from kerneljudge.worker.forward import float64_oracle

    tries: list[str] = []
    x = torch.arange(4, dtype=torch.float32)
    out = float64_oracle(torch.nn.Tanh(), [x], torch.device("cuda"), tries_made=tries)
    assert out.dtype == torch.float64 and torch.equal(out, torch.tanh(x.double()))
    assert tries == (["cuda"] if torch.cuda.is_available() else ["cuda failed", "cpu"])

    session = types.SimpleNamespace(host_oracles=0, request=lambda *a, **k: {})
    ReferenceSession.run_timed_call(session, "0", 1, True, 1.0, True)  # type: ignore[arg-type]
    cut = Reductions()
    assert cut.lines() == ()
    cut.audits = (session, session.host_oracles)  # type: ignore[assignment]
    session.request = lambda *a, **k: {"oracle_on_host": True}
    for _ in range(2):
        ReferenceSession.run_timed_call(session, "0", 1, True, 1.0, True)  # type: ignore[arg-type]
    assert session.host_oracles == 2

    held = [HeldTrial("0", 1, {}), HeldTrial("1", 2, {"oracle": True}, deferred=True)]
    prepared = {"public": held}
    cut.trials(prepared)
    held[1] = HeldTrial("1", 2, {"oracle_on_host": True})  # as the trials stage leaves it
    lines = (
        "1 of 2 trials were deferred: the reference runs them only when the candidate's are "
        "compared (no room to keep them ahead)",
        "the float64 oracle of 1 of 2 trials was computed on the host (the device ran out of "
        "memory for it)",
        "the float64 oracle of 2 audited timed call(s) was computed on the host (the device ran "
        "out of memory for it)",
    )
    assert cut.lines() == lines
    fields = {"problem": "p", "candidate_sha256": "0" * 64, "backend": "torch"}
    verdict = Verdict(status=Status.CORRECT, reason="", reductions=lines, **fields)
    assert Verdict.from_json(verdict.to_json()).reductions == lines
    console = Console(file=io.StringIO(), width=200)
    render_verdict(verdict, console)
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(f"reduced for want of memory: {line}" in shown for line in lines)
