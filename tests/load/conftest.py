"""The load tier's report: every verdict line the load tests log is repeated in the terminal
summary, so a CI log shows what happened under load even when every test passed."""

from __future__ import annotations

import pytest

_LINES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def verdict_log(request: pytest.FixtureRequest) -> list[str]:
    """A list the load tests append one line per verdict to (shown in the terminal summary)."""
    return request.config.stash.setdefault(_LINES, [])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(_LINES, [])
    if lines:
        terminalreporter.section("verdicts under load")
        for line in lines:
            terminalreporter.write_line(line)
