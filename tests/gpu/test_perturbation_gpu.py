"""GPU tier: the timed loop's structure-keeping perturbation (kerneljudge.worker.perturbation)
gives the same plan and the same bits on the GPU as on the CPU (the reference rebuilds a timed
call's inputs on its own device), and an honest kernel that relies on triangular inputs is
judged correct on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.timing import TimingConfig
from kerneljudge.worker.perturbation import Plan, perturb, plan_for

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    base = torch.rand(96, 96, generator=g, dtype=torch.float64) + 0.1
    out = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        out += [
            base.triu().to(dtype),
            base.tril().to(dtype),
            ((base + base.T) / 2).to(dtype),
            torch.rand(4, 64, 64, generator=g).triu().to(dtype),
            torch.rand(8, 300, generator=g).sort(-1).values.to(dtype),
            torch.rand(5000, generator=g).sort().values.to(dtype),
            torch.randn(33, 17, generator=g).to(dtype),
        ]
    return out


def test_plans_and_perturbed_bits_are_the_same_on_the_gpu_as_on_the_cpu() -> None:
    cuda = torch.device("cuda")
    for x in _inputs():
        plan = plan_for(x)
        assert plan_for(x.to(cuda)) == plan, (tuple(x.shape), x.dtype)
        for seed in (1, 77):
            (on_cpu,) = perturb([x], [plan], seed)
            (on_gpu,) = perturb([x.to(cuda)], [plan], seed)
            assert on_gpu.is_cuda
            same = torch.equal(on_gpu.cpu().view(torch.uint8), on_cpu.view(torch.uint8))
            assert same, (tuple(x.shape), x.dtype, plan, seed)
    # Every kind of change is among them.
    found = {plan_for(x) for x in _inputs()}
    assert Plan(None, scale="triangular", nudge=False) in found
    assert Plan(None, scale="symmetric", nudge=False) in found
    assert Plan(None, scale="uniform", nudge=False) in found
    assert Plan(0, scale="triangular", nudge=False) in found
    assert Plan(0, nudge=False) in found and Plan(0, columns=True) in found


def test_a_kernel_that_relies_on_triangular_inputs_is_correct_on_the_gpu(tmp_path: Path) -> None:
    config = JudgeConfig(
        device="cuda",
        cache_dir=tmp_path,
        trials=2,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    with Judge(FIXTURES / "triangular_problem.py", config) as judge:
        v = judge.evaluate(FIXTURES / "candidates" / "triangular_good.py")
    assert v.status is Status.CORRECT, v.reason
    assert v.timing is not None
    timed = {m.name: m.samples for m in v.timing.measurements}
    assert timed.get("candidate", 0) >= 5, timed
