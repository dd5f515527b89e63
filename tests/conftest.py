"""Shared fixtures and the test tiers.

GPU tests are marked ``gpu`` and skipped (with the reason) where no CUDA device is visible.
Real compiler builds share one build cache per checkout (``.kerneljudge-cache/tests``), so a
candidate is compiled once across test runs on the same machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """A build cache shared by every test that compiles for real."""
    path = Path(os.environ.get("KERNELJUDGE_TEST_CACHE", REPO / ".kerneljudge-cache" / "tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def tiny_problem() -> Path:
    """A small CPU problem with a Linear layer (fixtures/tiny_problem.py)."""
    return FIXTURES / "tiny_problem.py"
