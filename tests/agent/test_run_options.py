"""Options of ``kerneljudge episode`` and the configurations behind them: a value out of its
range is one line and exit status 2 before any episode starts, and the library refuses it with a
ValueError naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kerneljudge.agent import RunnerConfig, run_episodes
from kerneljudge.agent.runlog import RunLog
from kerneljudge.cli.app import app

DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
SMOKE = Path(__file__).resolve().parents[1] / "fixtures" / "smoke" / "problem.py"


def _episode(tmp_path: Path, *extra: str) -> Any:
    args = ["episode", "-p", "causal_gqa", "--model", "m", "--base-url", DEAD]
    return CliRunner().invoke(app, [*args, "--device", "cpu", "--out", str(tmp_path), *extra])


def _one_error_line(result: Any, start: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {start}"), lines[0]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--backoff", "-1"),
        ("--backoff", "nan"),
        ("--max-retries", "-1"),
        ("--request-timeout", "0"),
        ("--request-timeout", "-5"),
        ("--max-tokens", "0"),
        ("--temperature", "-0.5"),
        ("--benchmark-time", "-1"),
        ("--benchmark-time", "0"),
        ("--submit-time", "0"),
        ("--max-tool-calls", "0"),
        ("--max-turns", "0"),
        ("--trials", "0"),
        ("--submit-trials", "0"),
        ("--episodes", "0"),
        ("--concurrency", "0"),
        ("--judges", "-1"),
    ],
)
def test_an_option_out_of_range_is_one_line_and_exit_2(
    option: str, value: str, tmp_path: Path
) -> None:
    """The model client's options and the run's."""
    result = _episode(tmp_path, option, value)
    _one_error_line(result, f"{option} must be")
    assert not (tmp_path / "run.json").exists()  # no run was planned


def test_an_empty_problem_list_is_one_line_and_exit_2(tmp_path: Path) -> None:
    args = ["episode", "-p", ",", "--model", "m", "--base-url", DEAD, "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    _one_error_line(result, "--problem ',' names no problem")
    assert not (tmp_path / "run.json").exists()
    with pytest.raises(ValueError, match="no problem to run"):
        run_episodes([], RunnerConfig(model="m", base_url=DEAD), out_dir=tmp_path)


def test_a_prompt_dir_that_is_no_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = _episode(tmp_path / "out", "--prompt-dir", str(tmp_path / "nodir"))
    _one_error_line(result, f"the prompt folder {tmp_path / 'nodir'} does not exist")
    (tmp_path / "file.md").write_text("x")
    result = _episode(tmp_path / "out", "--prompt-dir", str(tmp_path / "file.md"))
    _one_error_line(result, f"the prompt folder {tmp_path / 'file.md'} is not a folder")
    assert not (tmp_path / "out" / "run.json").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backoff_s", -1.0),
        ("max_backoff_s", -1.0),
        ("max_retries", -1),
        ("request_timeout_s", 0.0),
        ("max_tokens", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
    ],
)
def test_runner_config_refuses_numbers_out_of_range(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        RunnerConfig(model="m", base_url=DEAD, **{field: value})
    ok = RunnerConfig(model="m", base_url=DEAD, backoff_s=0, max_retries=0, max_tokens=1)
    assert ok.backoff_s == 0 and ok.max_retries == 0


@pytest.mark.parametrize(("episodes", "hint"), [(1, False), (2, True)])
def test_the_resume_hint_of_an_unreachable_server_only_when_episodes_are_left(
    episodes: int, hint: bool, tmp_path: Path
) -> None:
    args = ["episode", "-p", str(SMOKE), "--model", "m", "--base-url", DEAD, "--device", "cpu"]
    args += ["--max-retries", "0", "--episodes", str(episodes), "--out", str(tmp_path)]
    args += ["--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    (line,) = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: cannot reach the model server at {DEAD}")
    assert ("--resume" in line) is hint, line


def test_resume_keeps_the_runs_concurrency_unless_given_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    base = ["episode", "--model", "m", "--base-url", DEAD, "--max-retries", "0", "--json"]
    first = [*base, "-p", str(SMOKE), "--device", "cpu", "--episodes", "6", "--concurrency", "2"]
    first += ["--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    assert CliRunner().invoke(app, first).exit_code == 2  # the server is unreachable
    log = RunLog(out, create=False)
    assert log.plan()["concurrency"] == 2
    assert any(st.summary is None for st in log.states())  # episodes left to resume
    assert CliRunner().invoke(app, [*base, "--resume", str(out)]).exit_code == 2
    assert (
        CliRunner().invoke(app, [*base, "--resume", str(out), "--concurrency", "1"]).exit_code == 2
    )
    assert [r["concurrency"] for r in log.run_records()] == [2, 2, 1]
