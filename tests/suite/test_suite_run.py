"""A real suite run: two bundled problems, their C++ examples (builds from the shared test
cache) and known-wrong ones, judged by ``kerneljudge suite run`` in a subprocess that is killed
with SIGKILL, resumed, interrupted with SIGINT (Ctrl-C), and resumed to the end; every pair is
judged exactly once."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kerneljudge.suite.runner import SuiteOptions, run_pairs, start_run
from kerneljudge.suite.store import ResultsStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# A forward of PyTorch operators only: causal_gqa's policy asks for a custom kernel.
TORCH_ONLY = """# expected: rejected
import math
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, q, k, v):
        group = q.shape[2] // k.shape[2]
        k = k.repeat_interleave(group, dim=2).transpose(1, 2)
        v = v.repeat_interleave(group, dim=2).transpose(1, 2)
        s = q.transpose(1, 2) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        return (s.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2)
"""

PAIRS = {
    ("causal_gqa", "cpp_reference"): "correct",
    ("causal_gqa", "cpp_wrong"): "incorrect",
    ("causal_gqa", "torch_only"): "rejected",
    ("triangle_attention", "cpp_reference"): "correct",
    ("triangle_attention", "cpp_wrong"): "incorrect",
}


def _candidates(root: Path) -> Path:
    for (problem, sample), expected in PAIRS.items():
        folder = root / problem
        folder.mkdir(parents=True, exist_ok=True)
        if sample == "torch_only":
            (folder / "torch_only.py").write_text(TORCH_ONLY)
            continue
        text = (EXAMPLES / problem / f"{sample}.py").read_text()
        assert f"# expected: {expected}" in text
        (folder / f"{sample}.py").write_text(text)  # same text: same build cache key
    return root


def _count(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT COUNT(*) FROM verdicts WHERE run_id='t'").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), PYTHONUNBUFFERED="1")
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kerneljudge", "suite", "run", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait_for(proc: subprocess.Popen[bytes], db: Path, count: int, log: Path) -> None:
    deadline = time.monotonic() + 900  # a liveness bound on a loaded machine, not a speed check
    while _count(db) < count:
        assert proc.poll() is None, f"exited {proc.returncode} early:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def _wait_for_text(proc: subprocess.Popen[bytes], log: Path, text: str) -> None:
    deadline = time.monotonic() + 900  # a liveness bound on a loaded machine, not a speed check
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} early:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def _finish(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=900)  # the same
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_killed_and_interrupted_run_resumes_and_judges_each_pair_once(
    tmp_path: Path, shared_cache: Path
) -> None:
    cands = _candidates(tmp_path / "cands")
    db = tmp_path / "results.db"
    common = ["--store", str(db)]
    first = [
        "causal_gqa",
        "triangle_attention",
        "-c",
        str(cands),
        "--run-id",
        "t",
        "--model",
        "examples",
        "--sampling",
        "temperature=0",
        "--device",
        "cpu",
        "--cache-dir",
        str(shared_cache),
        "--trials",
        "2",
        "--no-timing",
        *common,
    ]
    # 1. kill -9 once the first verdict is committed.
    log1 = tmp_path / "1.log"
    proc = _start(first, log1)
    _wait_for(proc, db, 1, log1)
    proc.kill()
    assert _finish(proc) == -signal.SIGKILL
    with ResultsStore(db) as store:
        before = [(r.id, r.problem, r.sample, r.stored_at) for r in store.verdicts("t")]
        assert store.run("t").state == "running"  # nobody could say otherwise
    assert 1 <= len(before) <= 3, log1.read_text()

    # 2. resume; Ctrl-C (SIGINT) once it has planned, while its judge starts or its first pair
    # is judged (after a verdict, the next cached pair can end the run before a signal lands).
    log2 = tmp_path / "2.log"
    proc = _start(["--resume", "t", *common], log2)
    _wait_for_text(proc, log2, "pairs already judged")
    proc.send_signal(signal.SIGINT)
    assert _finish(proc) == 130, log2.read_text()
    out2 = log2.read_text()
    assert f"{len(before)} pairs already judged" in out2
    assert "kerneljudge suite run --resume t" in out2
    with ResultsStore(db) as store:
        middle = [(r.id, r.problem, r.sample, r.stored_at) for r in store.verdicts("t")]
        assert store.run("t").state == "interrupted"
    assert middle[: len(before)] == before and len(before) <= len(middle) < len(PAIRS)

    # 3. resume to the end.
    log3 = tmp_path / "3.log"
    proc = _start(["--resume", "t", *common], log3)
    assert _finish(proc) == 0, log3.read_text()
    out3 = log3.read_text()
    assert f"{len(middle)} pairs already judged" in out3
    judged_now = re.search(r"(\d+) judged now", out3)
    assert judged_now and int(judged_now.group(1)) == len(PAIRS) - len(middle), out3

    with ResultsStore(db) as store:
        rows = list(store.verdicts("t"))
        info = store.run("t")
    assert [(r.id, r.problem, r.sample, r.stored_at) for r in rows][: len(middle)] == middle
    assert sorted((r.problem, r.sample) for r in rows) == sorted(PAIRS)  # each exactly once
    for r in rows:
        assert r.status == PAIRS[(r.problem, r.sample)], (r.problem, r.sample, r.verdict.reason)
        assert r.verdict.versions["torch"] and r.candidate_source
    assert (info.state, info.planned, info.judged, info.correct) == ("finished", 5, 5, 2)
    assert info.model == "examples" and info.sampling == {"temperature": 0}
    assert info.versions["torch"] and "cuda" in info.versions


def test_a_pair_that_cannot_run_here_is_left_for_a_resume(tmp_path: Path) -> None:
    """A CUDA candidate with --device cpu: no verdict is stored, the run ends ``incomplete``
    (it went through its plan; it was not interrupted)."""
    cands = tmp_path / "cands" / "causal_gqa"
    cands.mkdir(parents=True)
    (cands / "cuda_fused.py").write_text((EXAMPLES / "causal_gqa" / "cuda_fused.py").read_text())
    with ResultsStore(tmp_path / "r.db") as store:
        run = start_run(
            store,
            suite=["causal_gqa"],
            candidates=tmp_path / "cands",
            options=SuiteOptions(device="cpu", timing=False),
        )
        events: list[str] = []
        summary = run_pairs(store, run, lambda event, pair, data: events.append(event))
        assert summary.judged == 0 and list(summary.not_judged) == ["causal_gqa/cuda_fused"]
        assert "CUDA GPU" in summary.not_judged["causal_gqa/cuda_fused"]
        assert events == ["start", "pair", "skip", "end"]
        assert store.run(run).state == "incomplete" and not store.done(run)


_KB_PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 16
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""

_KB_KERNEL = """import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return {expr}
"""


def test_a_kernelbench_level_folder_and_run_folder_are_judged_timed_and_scored(
    tmp_path: Path,
) -> None:
    """KernelBench's own layouts, end to end: a timed correct sample and a wrong one; the
    stored speedup interval is what the metrics classify."""
    from kerneljudge.suite.metrics import Outcome, classify, compute_metrics

    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / "19_ReLU.py").write_text(_KB_PROBLEM)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "level_1_problem_19_sample_0_kernel.py").write_text(
        _KB_KERNEL.format(expr="x.clamp_min(0.0)")
    )
    (runs / "level_1_problem_19_sample_1_kernel.py").write_text(_KB_KERNEL.format(expr="x.abs()"))
    with ResultsStore(tmp_path / "r.db") as store:
        run = start_run(
            store,
            suite=[str(level)],
            candidates=runs,
            options=SuiteOptions(device="cpu", trials=2, max_time_s=0.3),
            model="kb",
        )
        summary = run_pairs(store, run)
        assert summary.statuses == {"correct": 1, "incorrect": 1}
        rows = {r.sample: r for r in store.verdicts(run)}
        assert rows["0"].level == 1 and rows["0"].problem == "19_ReLU"
        good = rows["0"]
        assert good.speedup is not None and good.speedup_lo <= good.speedup <= good.speedup_hi
        sample = good.as_sample()
        (g,) = compute_metrics(store.problems(run), store.samples(run), ps=(0.0, 1.0), ks=(1, 2))
    assert g.correctness == 0.5 and g.pass_at_k[2] == 1.0
    outcome = classify(sample, 1.0)
    expected = {Outcome.WIN: (0.5, 0.0), Outcome.TIE: (0.0, 0.5), Outcome.LOSS: (0.0, 0.0)}
    assert (g.fast_p[1].wins, g.fast_p[1].ties) == expected[outcome]


def test_a_run_owned_by_a_live_process_is_not_resumed_beside_it(tmp_path: Path) -> None:
    import socket

    import pytest

    from kerneljudge.suite.store import StoreError

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ResultsStore(tmp_path / "r.db") as store:
            store.create_run(
                "busy", spec={}, owner=f"{socket.gethostname()}:{sleeper.pid}"
            )  # state: running
            with pytest.raises(StoreError, match=f"being judged by process .*:{sleeper.pid}"):
                run_pairs(store, "busy")
    finally:
        sleeper.kill()
        sleeper.wait()
