"""GPU tier: trial inputs drawn on the GPU (kerneljudge.worker.drawn): the same seed gives the
same inputs there, and a verdict in which the candidate's worker draws as the reference's did
relays no input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.check.reference import ReferenceSession
from kerneljudge.problem import Problem

pytestmark = pytest.mark.gpu

PROBLEM = """
import torch
import torch.nn as nn

SHAPE_SETS = {"public": {}}


class Model(nn.Module):
    def forward(self, x, ids):
        return torch.relu(x) + ids.float().mean()


def get_inputs():
    return [torch.rand(512, 1024), torch.randint(0, 7, (64,))]


def get_init_inputs():
    return []
"""


def test_a_device_draw_is_on_the_device_and_repeats(tmp_path: Path) -> None:
    path = tmp_path / "p.py"
    path.write_text(PROBLEM)
    problem = Problem.load(path, probe=False)
    x, ids = problem.make_inputs(4, "cuda", on_device=True)
    assert x.is_cuda and ids.is_cuda and ids.dtype == torch.int64
    x2, ids2 = problem.make_inputs(4, "cuda", on_device=True)
    assert torch.equal(x, x2) and torch.equal(ids, ids2)
    assert not torch.equal(x, problem.make_inputs(5, "cuda", on_device=True)[0])


def test_a_gpu_verdict_relays_no_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.py"
    path.write_text(PROBLEM)
    cand = tmp_path / "c.py"
    cand.write_text(PROBLEM.replace("class Model(", "class ModelNew("))
    relayed = []
    held = ReferenceSession.held_inputs

    def counted(self: ReferenceSession, *a, **kw):  # type: ignore[no-untyped-def]
        relayed.append(1)
        return held(self, *a, **kw)

    monkeypatch.setattr(ReferenceSession, "held_inputs", counted)
    config = JudgeConfig(device="cuda", cache_dir=tmp_path / "cache", timing=False)
    with Judge(path, config) as judge:
        verdict = judge.evaluate(cand)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert relayed == []


def test_deferred_trials_and_audits_redraw_inputs_drawn_on_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inputs drawn on the GPU are held as their seed (redrawn for the timing's audits, not
    copied to the host); with no room to keep trials ahead the later ones run when compared."""
    from kerneljudge.judge.reference_side import ReferenceSide
    from kerneljudge.worker.kept_trials import KeptTrials, Redraw

    path = tmp_path / "p.py"
    path.write_text(PROBLEM)
    holder = KeptTrials()  # the holding alone, in this process
    holder.device, holder.held, holder.role = torch.device("cuda"), {}, "reference"
    holder.problem = Problem.load(path, probe=False)
    drawn = holder.problem.make_inputs(7, "cuda", on_device=True)
    holder.hold("0", drawn, 7, True)
    assert isinstance(holder.held["0"], Redraw)
    again = holder.held_inputs_of("0")
    assert all(torch.equal(a, b) for a, b in zip(again, drawn, strict=True))

    deferred: list[list[bool]] = []
    prepare = ReferenceSide.prepare

    def spied(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        made = prepare(self, *args, **kwargs)
        deferred.extend([h.deferred for h in held] for held in made.values())
        return made

    monkeypatch.setattr(ReferenceSide, "prepare", spied)
    cand = tmp_path / "c.py"
    cand.write_text(PROBLEM.replace("class Model(", "class ModelNew("))
    config = JudgeConfig(
        device="cuda", cache_dir=tmp_path / "cache", baselines=("eager",), graph_timing=False
    )
    with Judge(path, config) as judge:
        judge.reference.keep_bytes = 1
        verdict = judge.evaluate(cand)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert verdict.timing is not None and verdict.timing.rounds >= 1
    assert deferred[0] == [False] + [True] * (config.trials - 1)


WEIGHTED = """
import torch
import torch.nn as nn

SHAPE_SETS = {"public": {}}


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.register_buffer("scale", torch.rand(n))
        {host_code}

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
"""


@pytest.mark.parametrize(
    ("host_code", "on_gpu"),
    [("pass", True), ("torch.empty(1).numpy()  # needs a host tensor", False)],
)
def test_weights_are_drawn_on_the_gpu_alike_in_both_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_code: str, on_gpu: bool
) -> None:
    """The weights are drawn by the device's generator (the same seed: the same weights), a
    constructor that needs host tensors is drawn on the CPU, and in both cases the candidate's
    worker draws what the reference's did: no state dict is sent."""
    from kerneljudge.worker.drawn import draw_model

    path = tmp_path / "p.py"
    path.write_text(WEIGHTED.replace("{host_code}", host_code))
    problem = Problem.load(path, probe=False)
    one, first = draw_model(problem, 3, [256], "cuda")
    other, second = draw_model(problem, 3, [256], "cuda")
    assert one.fc.weight.is_cuda is on_gpu and one.scale.is_cuda is on_gpu
    assert first == second and torch.equal(one.fc.weight.cpu(), other.fc.weight.cpu())
    assert first["weights_on"] == ("cuda" if on_gpu else "cpu")
    assert first != draw_model(problem, 4, [256], "cuda")[1]

    sent = []
    state = ReferenceSession.state_dict

    def counted(self: ReferenceSession, *a, **kw):  # type: ignore[no-untyped-def]
        sent.append(1)
        return state(self, *a, **kw)

    monkeypatch.setattr(ReferenceSession, "state_dict", counted)
    cand = tmp_path / "c.py"
    cand.write_text(path.read_text().replace("class Model(", "class ModelNew("))
    config = JudgeConfig(device="cuda", cache_dir=tmp_path / "cache", timing=False)
    with Judge(path, config) as judge:
        verdict = judge.evaluate(cand)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert sent == []


class _Tabled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.table = torch.arange(3)  # neither a parameter nor a buffer: stays on the host


def test_construct_on_the_gpu_unless_the_model_keeps_host_tensors() -> None:
    from kerneljudge.worker.drawn import construct

    cuda = torch.device("cuda", torch.cuda.current_device())
    assert construct(torch.nn.Linear, [4, 4], cuda, weight_bytes=80).weight.is_cuda
    tabled = construct(_Tabled, [], cuda)
    assert not tabled.fc.weight.is_cuda and not tabled.table.is_cuda


@pytest.mark.parametrize("host_code", ["pass", "torch.empty(1).numpy()"])
def test_a_draw_gives_back_the_cuda_generator_as_it_found_it(
    tmp_path: Path, host_code: str
) -> None:
    """On the device, or on the CPU after the device's attempt; and a candidate's construction
    on the device (whose parameters the reference's replace) draws nothing from it."""
    from kerneljudge.worker.drawn import construct, draw_model

    path = tmp_path / "p.py"
    path.write_text(WEIGHTED.replace("{host_code}", host_code))
    problem = Problem.load(path, probe=False)
    torch.cuda.manual_seed(11)
    before = torch.cuda.get_rng_state()
    draw_model(problem, 3, [256], "cuda")
    assert torch.equal(before, torch.cuda.get_rng_state())
    cuda = torch.device("cuda", torch.cuda.current_device())
    assert construct(torch.nn.Linear, [64, 64], cuda, weight_bytes=1 << 16).weight.is_cuda
    assert torch.equal(before, torch.cuda.get_rng_state())
