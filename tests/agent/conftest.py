"""Fixtures of the runner's tests under the names they use (the shared CPU judge, its build
cache and the short-timing EnvConfig of tests/conftest.py); the loopback server
(fake_server.py) is importable from here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kerneljudge.env import EnvConfig
from kerneljudge.judge import Judge

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def agent_cache(gqa_cache: Path) -> Path:
    """tests/conftest.py ``gqa_cache``."""
    return gqa_cache


@pytest.fixture(scope="session")
def agent_config(gqa_env_config: EnvConfig) -> EnvConfig:
    """tests/conftest.py ``gqa_env_config``."""
    return gqa_env_config


@pytest.fixture(scope="session")
def agent_judge(gqa_judge: Judge) -> Judge:
    """tests/conftest.py ``gqa_judge``."""
    return gqa_judge
