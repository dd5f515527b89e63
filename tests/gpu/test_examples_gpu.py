"""GPU tier: every bundled example gets its expected status on a real CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig
from kerneljudge.cli.examples import find_examples

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

EXAMPLES = find_examples()


@pytest.fixture(scope="module")
def judges(shared_cache: Path):
    config = JudgeConfig(
        device="auto",
        cache_dir=shared_cache,
        run_timeout_s=20,  # the hanging example waits this long
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=2.0),
    )
    opened: dict[str, Judge] = {}
    yield lambda name: opened.setdefault(name, Judge(name, config))
    for j in opened.values():
        j.close()


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.problem}/{e.path.name}" for e in EXAMPLES])
def test_example_gets_expected_status(judges, example) -> None:
    verdict = judges(example.problem).evaluate(example.path)
    assert verdict.status is example.expected, verdict.reason
    if example.expected is Status.CORRECT:
        on_gpu = example.backend in ("cuda", "triton")
        assert verdict.timing is not None
        assert verdict.timing.clock == ("cuda_event" if on_gpu else "monotonic")
        if example.backend == "cuda":
            s = verdict.timing.speedup("eager")
            assert s is not None and s.median > 1.0, "a fused CUDA example must beat eager"
    if example.compile_error_line is not None:
        first = next(m for m in verdict.build.messages if m.severity == "error")
        assert first.candidate_line == example.compile_error_line, verdict.build.log


def test_healthy_after_illegal_address(judges) -> None:
    """A poisoned CUDA context ends that worker only; the next candidate is judged normally."""
    root = Path(__file__).resolve().parents[2] / "examples" / "causal_gqa"
    judge = judges("causal_gqa")
    bad = judge.evaluate(root / "cuda_illegal_address.py")
    assert bad.status is Status.RUNTIME_ERROR
    good = judge.evaluate(root / "cuda_fused.py")
    assert good.status is Status.CORRECT, good.reason
