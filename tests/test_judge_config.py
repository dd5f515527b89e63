"""JudgeConfig and EnvConfig refuse values out of range with one error naming the field, and the
command lines say so in one line with exit status 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.env import EnvConfig
from kerneljudge.errors import ConfigError, KernelJudgeError
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.judge import config as judge_config
from kerneljudge.timing import TimingConfig

FIX = Path(__file__).parent / "fixtures"
runner = CliRunner()

BAD: list[tuple[str, Any]] = [
    ("device", "gpu"),
    ("device", "cuda:"),
    ("device", "cuda:x"),
    ("device", ""),
    ("trials", 0),
    ("trials", -3),
    ("trials", 2.5),
    ("tolerance", "loose"),
    ("baselines", ("eager", "eagre")),
    ("baselines", "eager"),
    ("shape_sets", ()),
    ("shape_sets", "public"),
    ("build_timeout_s", 0.0),
    ("build_timeout_s", -1.0),
    ("run_timeout_s", 0),
    ("run_timeout_s", float("nan")),
    ("threads", -1),
    ("memory_budget_mib", -1),
    ("atol", -1e-4),
    ("rtol", -0.5),
]


@pytest.mark.parametrize("name, value", BAD)
def test_a_bad_field_is_one_error_naming_it(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        JudgeConfig(**{name: value})
    err = info.value
    assert err.field == name and name in str(err) and "\n" not in str(err)
    assert isinstance(err, ValueError) and isinstance(err, KernelJudgeError)


@pytest.mark.parametrize("max_time_s", [0.0, -1.0, float("nan"), float("inf")])
def test_a_timing_budget_out_of_range_is_one_error_naming_it(max_time_s: float) -> None:
    # NaN and infinity never stopped the timing loop on time; 0 or less timed one round.
    with pytest.raises(ConfigError) as info:
        JudgeConfig(timing_config=TimingConfig(max_time_s=max_time_s))
    assert info.value.field == "max_time_s" and "\n" not in str(info.value)
    assert info.value.for_option().startswith("--max-time must be")
    assert JudgeConfig(timing_config=TimingConfig(max_time_s=0.25)).timing_config.max_time_s


@pytest.mark.parametrize(
    "changes",
    [
        {"device": "cuda:3", "trials": 1, "tolerance": "allclose"},
        {"device": "cpu", "baselines": (), "shape_sets": ("public", "heldout_a")},
        {"device": "cuda", "baselines": ["compile"], "atol": 0.0, "rtol": 1e-3},
        {"build_timeout_s": 1, "run_timeout_s": 0.5, "threads": 0, "memory_budget_mib": 0},
    ],
)
def test_good_values_are_kept(changes: dict[str, Any]) -> None:
    config = JudgeConfig(**changes)
    assert all(getattr(config, k) == v for k, v in changes.items())


def test_replace_checks_again() -> None:
    with pytest.raises(ConfigError, match="trials"):
        dataclasses.replace(JudgeConfig(), trials=0)


def test_a_judge_configured_with_a_bad_value_refuses_it() -> None:
    with Judge(FIX / "tiny_problem.py", JudgeConfig(device="cpu")) as j:
        with pytest.raises(ConfigError, match="baselines"):
            with j.configured(baselines=("fast",)):
                pass
        assert j.config.baselines == JudgeConfig().baselines


def test_env_config_shares_the_checks_and_the_defaults() -> None:
    shared = ("device", "trials", "tolerance", "baselines", "build_timeout_s", "run_timeout_s")
    for name, value in BAD:
        if name in shared + ("threads",):
            with pytest.raises(ConfigError) as info:
                EnvConfig(**{name: value})
            assert info.value.field == name
    env, judge = EnvConfig(), JudgeConfig()
    for name in shared + ("threads",):
        assert getattr(env, name) == getattr(judge, name), name
    assert judge.build_timeout_s == judge_config.DEFAULT_BUILD_TIMEOUT_S


def test_the_option_name_replaces_the_field_name() -> None:
    err = ConfigError("run_timeout_s", "run_timeout_s must be a positive number, not 0")
    assert err.for_option() == "--run-timeout must be a positive number, not 0"
    err = ConfigError("memory_budget_mib", "memory_budget_mib must be at least 0, not -1")
    assert err.for_option().startswith("--memory-budget must")
    assert ConfigError("shape_sets", "unknown shape_sets").for_option() == "unknown --shape-sets"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N, not 'gpu'"),
        (["--baselines", "eager,fast"], "unknown --baselines ['fast']"),
        (["--run-timeout", "0"], "--run-timeout must be a positive number"),
        (["--build-timeout", "-5"], "--build-timeout must be a positive number"),
        (["--shape-sets", ","], "--shape-sets must be a non-empty list"),
        (["--atol", "-1"], "--atol must be a number of at least 0"),
        (["--max-time", "nan"], "--max-time must be a positive number of seconds"),
        (["--max-time", "-1"], "--max-time must be a positive number of seconds"),
        (["--max-time", "inf"], "--max-time must be finite"),
    ],
)
def test_eval_says_a_bad_option_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    res = runner.invoke(
        app,
        [
            "eval",
            str(FIX / "candidates" / "good.py"),
            "-p",
            str(FIX / "tiny_problem.py"),
            "--cache-dir",
            str(tmp_path),
            *args,
        ],
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], res.output
    assert "Traceback" not in res.output


def test_suite_run_says_a_bad_option_in_one_line(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "suite",
            "run",
            str(FIX / "tiny_problem.py"),
            "--candidates",
            str(tmp_path),
            "--baselines",
            "eager,fast",
            "--store",
            str(tmp_path / "results.db"),
        ],
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown --baselines ['fast']" in lines[0], res.output
    assert not (tmp_path / "results.db").exists()


def test_episode_says_a_bad_option_in_one_line(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        ["episode", "--problem", "causal_gqa", "--device", "tpu", "--out", str(tmp_path)],
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--device must be auto, cpu, cuda or cuda:N" in lines[0]
