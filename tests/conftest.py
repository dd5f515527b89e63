"""Shared fixtures and the test tiers.

GPU tests are marked ``gpu`` and skipped (with the reason) where no CUDA device is visible.
Real compiler builds share one build cache per checkout (``.kerneljudge-cache/tests``), so a
candidate is compiled once across test runs on the same machine, and every build shares one
store of precompiled headers there. The environment's and the
agent runner's tests (tests/env, tests/agent) share one CPU judge on causal_gqa without its
custom-kernel policy (``gqa_judge``) and one short-timing ``EnvConfig`` (``gqa_env_config``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:
    from kerneljudge.env import EnvConfig
    from kerneljudge.judge import Judge

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: causal_gqa without its custom-kernel policy: the env and agent tests run plain-PyTorch
#: candidates on it.
ANY_KERNEL_GQA = FIXTURES / "causal_gqa_any_kernel.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' own state folder: a service a test starts records itself there (not in
    the user's), and a `kerneljudge eval` a test runs finds no service it did not start."""
    saved = os.environ.get("KERNELJUDGE_STATE_DIR")
    os.environ["KERNELJUDGE_STATE_DIR"] = str(tmp_path_factory.mktemp("state"))
    yield
    if saved is None:
        os.environ.pop("KERNELJUDGE_STATE_DIR", None)
    else:
        os.environ["KERNELJUDGE_STATE_DIR"] = saved


@pytest.fixture(scope="session", autouse=True)
def _shared_precompiled_headers() -> Iterator[None]:
    """One store of precompiled headers for every build of the run, whatever its cache
    folder (a variant is made once per checkout, beside the first build that needs it)."""
    saved = os.environ.get("KERNELJUDGE_PCH_DIR")
    root = Path(os.environ.get("KERNELJUDGE_TEST_CACHE", REPO / ".kerneljudge-cache" / "tests"))
    os.environ["KERNELJUDGE_PCH_DIR"] = str(root / "pch")
    yield
    if saved is None:
        os.environ.pop("KERNELJUDGE_PCH_DIR", None)
    else:
        os.environ["KERNELJUDGE_PCH_DIR"] = saved


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """A build cache shared by every test that compiles for real."""
    path = Path(os.environ.get("KERNELJUDGE_TEST_CACHE", REPO / ".kerneljudge-cache" / "tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def gqa_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build cache for the env and agent tests only (a fresh temporary directory)."""
    return tmp_path_factory.mktemp("gqa-cache")


@pytest.fixture(scope="session")
def gqa_env_config(gqa_cache: Path) -> EnvConfig:
    """CPU, eager baseline only, 0.3 s of timing, one trial per shape set on submission."""
    from kerneljudge.env import EnvConfig

    return EnvConfig(
        device="cpu",
        cache_dir=str(gqa_cache),
        baselines=("eager",),
        benchmark_time_s=0.3,
        submit_time_s=0.3,
        submit_trials=1,
        profile_calls=2,
    )


@pytest.fixture(scope="session")
def gqa_judge(gqa_cache: Path) -> Iterator[Judge]:
    """One CPU judge on ``ANY_KERNEL_GQA`` for every env or agent test that runs candidates
    (its workers start once): one thread, 0.3 s of timing, at least 5 samples."""
    from kerneljudge.judge import Judge, JudgeConfig
    from kerneljudge.timing import TimingConfig

    config = JudgeConfig(
        device="cpu",
        cache_dir=gqa_cache,
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5, warmup_calls=1),
    )
    with Judge(ANY_KERNEL_GQA, config) as judge:
        yield judge


@pytest.fixture
def tiny_problem() -> Path:
    """A small CPU problem with a Linear layer (fixtures/tiny_problem.py)."""
    return FIXTURES / "tiny_problem.py"


@pytest.fixture
def slow_reference_problem(tmp_path: Path) -> Callable[[float], Path]:
    """Writes fixtures/slow_reference_problem.py with its reference sleeping the given seconds
    a call, into the test's folder; returns the file."""

    def write(sleep_s: float) -> Path:
        text = (FIXTURES / "slow_reference_problem.py").read_text()
        path = tmp_path / f"slow_reference_{sleep_s:g}.py"
        path.write_text(text.replace("SLEEP_S = 0.0", f"SLEEP_S = {sleep_s!r}"))
        return path

    return write


@pytest.fixture
def fresh_worker_report(tmp_path: Path) -> Callable[[str | Path, str], str]:
    """``report(problem, device)``: what a judge's freshly started candidate worker had loaded
    before any candidate ran, as ``"dynamo: <bool> cuda: <bool>"`` (torch._dynamo imported, a
    CUDA context initialised). A probe candidate raises that text at import."""
    from kerneljudge import Judge, JudgeConfig
    from kerneljudge.device import resolve_device
    from kerneljudge.worker.process import CandidateFault

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys, torch\n"
        "raise RuntimeError(f\"dynamo: {'torch._dynamo' in sys.modules} "
        'cuda: {torch.cuda.is_initialized()}")\n'
    )

    def report(problem: str | Path, device: str) -> str:
        with Judge(problem, JudgeConfig(device=device, cache_dir=tmp_path)) as judge:
            worker = judge._pool(resolve_device(device, device != "cpu")).take()
            try:
                with pytest.raises(CandidateFault) as fault:
                    worker.request("load_candidate", 30.0, path=str(probe))
            finally:
                worker.close()
        found = re.search(r"dynamo: \w+ cuda: \w+", str(fault.value))
        assert found, str(fault.value)
        return found.group(0)

    return report
