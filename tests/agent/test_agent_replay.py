"""Replaying transcripts through the judge, without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneljudge.agent import read_transcript, recorded_turns, replay, write_transcript_from_calls
from kerneljudge.cli.app import app
from kerneljudge.env import EnvConfig
from kerneljudge.judge import Judge

REPO = Path(__file__).resolve().parents[2]
CANDIDATES = REPO / "tests" / "env" / "candidates"
EXAMPLE = REPO / "examples" / "transcripts" / "causal_gqa_seed002.jsonl"


def kc(name: str) -> dict[str, str]:
    return {"kernel_code": (CANDIDATES / f"{name}.py").read_text()}


def test_replay_reruns_the_calls_and_scores(
    agent_config: EnvConfig, agent_judge: Judge, tmp_path: Path
) -> None:
    source = write_transcript_from_calls(
        tmp_path / "recorded.jsonl",
        "causal_gqa",
        [
            [("run_correctness", kc("torch_ok"))],
            [("submit_kernel", kc("torch_ok")), ("run_benchmark", kc("torch_ok"))],
        ],
        env_config=agent_config.replace(submit_shape_sets=("public",)),
        model="someone",
    )
    summary = replay(source, out_dir=tmp_path / "out", judge=agent_judge)
    assert summary.status == "correct" and summary.submitted_by == "model"
    assert summary.model == "someone" and summary.tool_calls == 2 and summary.turns == 2
    recs = read_transcript(summary.transcript)
    assert recs[0]["replay_of"] == str(source)
    assert [r["type"] for r in recs[3:]] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
        "skipped",
        "summary",
    ]
    assert recs[4]["observation"].startswith("run_correctness PASSED: (5 / 5)")
    lines = (tmp_path / "out" / "summary.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["status"] == "correct"


def test_cli_replay_of_a_transcript_that_never_submits(tmp_path: Path) -> None:
    bad = {"kernel_code": (CANDIDATES / "torch_syntax_error.txt").read_text()}
    source = write_transcript_from_calls(
        tmp_path / "t.jsonl",
        "causal_gqa",
        [[("compile_kernel", bad)], [("compile_kernel", bad)]],
        env_config=EnvConfig(device="cpu", max_tool_calls=5),
    )
    result = CliRunner().invoke(
        app,
        [
            "episode",
            "--replay",
            str(source),
            "--out",
            str(tmp_path / "out"),
            "--cache-dir",
            str(tmp_path / "c"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["stop_reason"] == "transcript_ended" and summary["reward"] == 0.0
    assert summary["tool_calls"] == 2
    header = read_transcript(summary["transcript"])[0]
    assert header["env_config"]["max_tool_calls"] == 5  # the transcript's budget is kept
    assert header["env_config"]["cache_dir"] == str(tmp_path / "c")  # an option set wins


def test_example_transcript_holds_the_recorded_submission() -> None:
    recs = read_transcript(EXAMPLE)
    assert recs[0]["problem"] == "causal_gqa"
    (turn,) = recorded_turns(recs)
    (call,) = turn
    assert call.name == "submit_kernel"
    submitted = json.loads(call.arguments)["kernel_code"]
    example = (REPO / "examples" / "causal_gqa" / "seed002_submission.py").read_text()
    assert example.endswith(submitted) and "class ModelNew(nn.Module)" in submitted
    assert not submitted.startswith("#")


def test_example_transcript_on_a_cpu_gets_a_tool_error(tmp_path: Path) -> None:
    summary = replay(
        EXAMPLE, out_dir=tmp_path, overrides={"device": "cpu", "cache_dir": str(tmp_path / "c")}
    )
    tool = [r for r in read_transcript(summary.transcript) if r["type"] == "tool"][0]
    assert "needs a CUDA GPU" in tool["observation"]
    assert summary.status == "none" and summary.reward == 0.0


@pytest.mark.slow
@pytest.mark.gpu
def test_example_transcript_replays_on_the_gpu(tmp_path: Path, shared_cache: Path) -> None:
    # Eager only: torch.compile of this reference (a Python loop over 80 positions) takes
    # minutes; the build cache is the one the other GPU tests fill.
    overrides = {"baselines": ["eager"], "cache_dir": str(shared_cache)}
    summary = replay(EXAMPLE, out_dir=tmp_path, overrides=overrides)
    assert summary.status == "correct", summary
    assert summary.submitted_by == "model" and summary.reward is not None and summary.reward > 0
