"""Fixtures of the environment's tests: CPU only, a temporary build cache, one shared judge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.env import EnvConfig
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

CANDIDATES = Path(__file__).resolve().parent / "candidates"
#: causal_gqa without its custom-kernel policy: these tests run plain-PyTorch candidates.
ANY_KERNEL_GQA = Path(__file__).resolve().parents[1] / "fixtures" / "causal_gqa_any_kernel.py"


@pytest.fixture(scope="session")
def env_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build cache for these tests only."""
    return tmp_path_factory.mktemp("env-cache")


@pytest.fixture(scope="session")
def fast_config(env_cache: Path) -> EnvConfig:
    """CPU, eager baseline only, short timing, one trial per shape set on submission."""
    return EnvConfig(
        device="cpu",
        cache_dir=str(env_cache),
        baselines=("eager",),
        benchmark_time_s=0.3,
        submit_time_s=0.3,
        submit_trials=1,
        profile_calls=2,
    )


@pytest.fixture(scope="session")
def cpu_judge(env_cache: Path) -> Iterator[Judge]:
    """One judge on causal_gqa (without its custom-kernel policy) for every test that runs
    candidates (its workers start once)."""
    config = JudgeConfig(
        device="cpu",
        cache_dir=env_cache,
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5, warmup_calls=1),
    )
    with Judge(ANY_KERNEL_GQA, config) as judge:
        yield judge
