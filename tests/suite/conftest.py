"""Fixtures of the suite tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def report_store(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """A results store with two small real CPU runs, ``a`` and ``b`` (see ``report_runs``)."""
    from .report_runs import make_runs

    return make_runs(tmp_path_factory.mktemp("report-runs"), shared_cache)
