"""Smoke test: the judge's main path on the CPU, end to end, in a few seconds.

A plain-PyTorch candidate on a 4 x 8 problem goes through the build (a cache lookup: the
``torch`` backend compiles nothing), its worker's load, the correctness trials, a minimal
timing pass against the eager reference, and the verdict. ``pytest -m smoke`` runs it alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig

SMOKE = Path(__file__).parent / "fixtures" / "smoke"

pytestmark = pytest.mark.smoke


def test_torch_candidate_is_judged_correct_end_to_end(tmp_path: Path) -> None:
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path,
        trials=2,
        baselines=("eager",),
        threads=1,
        timing_config=TimingConfig(
            warmup_calls=1,
            min_samples=3,
            min_time_s=0.0,
            min_rounds=1,
            max_time_s=0.05,
            remeasure=False,
        ),
    )
    with Judge(SMOKE / "problem.py", config) as judge:
        v = judge.evaluate(SMOKE / "candidate.py")
    assert v.status is Status.CORRECT, v.reason
    assert v.backend == "torch"
    assert v.build is not None and v.build.ok
    assert v.check is not None and v.check.passed
    assert list(v.stage_s) == ["build", "worker", "reference", "load", "trials", "timing"]
    assert v.timing is not None
    samples = {m.name: m.samples for m in v.timing.measurements}
    assert set(samples) == {"candidate", "eager"}
    assert min(samples.values()) >= 3, samples
    assert [s.baseline for s in v.timing.speedups] == ["eager"]
