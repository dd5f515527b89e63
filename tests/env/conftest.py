"""Fixtures of the environment's tests under the names they use: the shared CPU judge, its
build cache and the short-timing EnvConfig of tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge.env import EnvConfig
from kerneljudge.judge import Judge


@pytest.fixture(scope="session")
def env_cache(gqa_cache: Path) -> Path:
    """The build cache of ``cpu_judge`` and ``fast_config`` (tests/conftest.py ``gqa_cache``)."""
    return gqa_cache


@pytest.fixture(scope="session")
def fast_config(gqa_env_config: EnvConfig) -> EnvConfig:
    """tests/conftest.py ``gqa_env_config``."""
    return gqa_env_config


@pytest.fixture(scope="session")
def cpu_judge(gqa_judge: Judge) -> Judge:
    """tests/conftest.py ``gqa_judge``: causal_gqa without its custom-kernel policy."""
    return gqa_judge
