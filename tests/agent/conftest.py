"""Fixtures of the runner's tests: the loopback server, CPU only, a temporary build cache."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.env import EnvConfig
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

CANDIDATES = Path(__file__).resolve().parents[1] / "env" / "candidates"
#: causal_gqa without its custom-kernel policy: these tests run plain-PyTorch candidates.
ANY_KERNEL_GQA = Path(__file__).resolve().parents[1] / "fixtures" / "causal_gqa_any_kernel.py"


@pytest.fixture(scope="session")
def agent_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agent-cache")


@pytest.fixture(scope="session")
def agent_config(agent_cache: Path) -> EnvConfig:
    """CPU, eager baseline only, short timing, one trial per shape set on submission."""
    return EnvConfig(
        device="cpu",
        cache_dir=str(agent_cache),
        baselines=("eager",),
        benchmark_time_s=0.3,
        submit_time_s=0.3,
        submit_trials=1,
        profile_calls=2,
    )


@pytest.fixture(scope="session")
def agent_judge(agent_cache: Path) -> Iterator[Judge]:
    config = JudgeConfig(
        device="cpu",
        cache_dir=agent_cache,
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5, warmup_calls=1),
    )
    with Judge(ANY_KERNEL_GQA, config) as judge:
        yield judge
