"""GPU tier: the timing stage's CUDA-graph replays (kerneljudge.timing.graph_pass).

A host-bound reference (a few small operators) against candidates in plain PyTorch: the
honest one gets both speedups and host shares; one that synchronises in forward, and one that
behaves otherwise while it is captured, are timed by launched calls alone with the reason; the
worker-level capture refuses a forward whose replay differs from its call.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig
from kerneljudge.worker.graphs import NotCapturable, capture

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

HEAD = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)
"""

HONEST = (
    HEAD
    + """
    def forward(self, x):
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
"""
)

SYNCHRONISES = (
    HEAD
    + """
    def forward(self, x):
        torch.cuda.synchronize()
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
"""
)

# Right when called, wrong while captured: a replay would return the captured call's zeros.
KNOWS_CAPTURE = (
    HEAD
    + """
    def forward(self, x):
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros_like(x)
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
"""
)


@pytest.fixture(scope="module")
def judge(shared_cache: Path):
    config = JudgeConfig(
        device="cuda",
        cache_dir=shared_cache,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=1.0),
    )
    j = Judge(FIXTURES / "tiny_problem.py", config)
    yield j
    j.close()


def _judge(judge: Judge, tmp_path: Path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return judge.evaluate(path)


def test_honest_candidate_gets_both_speedups_and_host_shares(judge, tmp_path: Path) -> None:
    v = _judge(judge, tmp_path, HONEST, "honest")
    assert v.status is Status.CORRECT, v.reason
    g = v.timing.graph
    assert g is not None and not g.not_captured and g.seconds > 0, g
    replay = g.speedup("eager")
    assert replay is not None and replay.ci95[0] <= replay.median <= replay.ci95[1]
    # The same operators on both sides: a replay's speedup is near 1.
    assert 0.8 < replay.median < 1.25, replay
    for name in ("eager", "candidate"):
        assert 0.0 <= g.host_share[name] <= 1.0
        launched, replayed = v.timing.measurement(name), g.measurement(name)
        assert replayed.median_ms <= launched.median_ms * 1.05, (launched, replayed)
    lo, hi = g.host_range["eager"]
    assert lo <= v.timing.speedup("eager").median * 1.0001 and hi >= lo


def test_a_synchronising_forward_is_timed_by_launches_with_the_reason(judge, tmp_path) -> None:
    v = _judge(judge, tmp_path, SYNCHRONISES, "synchronises")
    assert v.status is Status.CORRECT, v.reason
    assert v.timing.speedup("eager") is not None
    g = v.timing.graph
    assert g is not None and "candidate" in g.not_captured and not g.speedups
    assert "captur" in g.not_captured["candidate"]
    assert g.measurement("eager") is not None  # the baseline's replays, timed alone


def test_a_forward_that_knows_it_is_captured_is_not_replayed(judge, tmp_path) -> None:
    v = _judge(judge, tmp_path, KNOWS_CAPTURE, "knows_capture")
    assert v.status is Status.CORRECT, v.reason  # its launched calls are right
    g = v.timing.graph
    assert g is not None and "candidate" in g.not_captured and not g.speedups
    assert "differs" in g.not_captured["candidate"]


def test_capture_checks_its_replay_against_the_call() -> None:
    device = torch.device("cuda")
    x = torch.randn(64, 32, device=device)
    lin = torch.nn.Linear(32, 32).to(device)
    cap = capture(lambda t: torch.relu(lin(t)), [x], device)
    y = torch.randn(64, 32, device=device)
    cap.load([y])
    torch.testing.assert_close(cap.replay().clone(), torch.relu(lin(y)))
    state = {"calls": 0}

    def counted(t):  # host logic: a Python counter the capture bakes in as a constant
        state["calls"] += 1
        return torch.relu(lin(t)) * state["calls"]

    with pytest.raises(NotCapturable, match="differs"):
        capture(counted, [x], device)
    with pytest.raises(NotCapturable, match="captur"):
        capture(lambda t: t * float(t.sum()), [x], device)  # a host read of a device value
    # The failed capture left the default generator usable: draws after it work and repeat.
    torch.manual_seed(5)
    first = torch.randn(8, device=device)
    torch.manual_seed(5)
    torch.testing.assert_close(torch.randn(8, device=device), first)
