"""GPU tier: after a poisoned CUDA context, a kernel that never ends and a GPU OOM in a row,
the next correct candidate still gets a correct verdict with a sane time."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
#: causal_gqa without its custom-kernel policy: the fault candidates are plain PyTorch.
OPEN_GQA = ROOT / "tests" / "fixtures" / "causal_gqa_any_kernel.py"
FAULTS = [
    ("tests/adversarial/gpu/gpu_illegal_address.py", Status.RUNTIME_ERROR),
    ("tests/adversarial/gpu/gpu_hang_kernel.py", Status.TIMEOUT),
    ("tests/adversarial/gpu/gpu_oom_huge.py", Status.RUNTIME_ERROR),
]


@pytest.mark.slow
def test_faults_in_a_row_leave_the_judge_healthy(shared_cache: Path) -> None:
    config = JudgeConfig(
        device="cuda",  # "auto" would judge the plain-torch OOM candidate on the CPU
        cache_dir=shared_cache,
        run_timeout_s=20,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=2.0),
    )
    good = ROOT / "examples" / "causal_gqa" / "cuda_fused.py"
    with Judge(OPEN_GQA, config) as judge:
        before = judge.evaluate(good)
        assert before.status is Status.CORRECT, before.reason
        for path, status in FAULTS:
            verdict = judge.evaluate(ROOT / path)
            assert verdict.status is status, (path, verdict.reason)
        after = judge.evaluate(good)
    assert after.status is Status.CORRECT, after.reason
    t_before = before.timing.measurement("candidate").median_ms
    t_after = after.timing.measurement("candidate").median_ms
    print(f"candidate median before {t_before:.4f} ms, after {t_after:.4f} ms")
    assert abs(t_after / t_before - 1) < 0.25, (t_before, t_after)
