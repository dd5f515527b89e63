"""The episode runner over real HTTP on loopback, against a scripted chat-completions server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_server import FakeServer, HttpError, Reply, by_turn
from typer.testing import CliRunner

from kerneljudge.agent import RunnerConfig, read_transcript, run_episode, run_episodes
from kerneljudge.agent.client import ModelClient, ServerUnreachable
from kerneljudge.cli.app import app
from kerneljudge.env import EnvConfig
from kerneljudge.errors import ProblemError

CANDIDATES = Path(__file__).resolve().parents[1] / "env" / "candidates"
ANY_KERNEL_GQA = Path(__file__).resolve().parents[1] / "fixtures" / "causal_gqa_any_kernel.py"


def code(name: str) -> str:
    path = CANDIDATES / f"{name}.py"
    return (path if path.exists() else path.with_suffix(".txt")).read_text()


def kc(name: str) -> dict[str, str]:
    return {"kernel_code": code(name)}


def records(path: Path | str, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_transcript(path) if r["type"] == kind]


def runner(base_url: str, **kw: Any) -> RunnerConfig:
    return RunnerConfig(model="scripted", base_url=base_url, backoff_s=0.01, **kw)


@pytest.mark.slow
def test_episode_end_to_end_through_the_cli(agent_cache: Path, tmp_path: Path) -> None:
    """compile error -> (fix + failing check, in one reply) -> passing check -> submission."""
    script = by_turn(
        [
            Reply(
                "Let me compile the C++ version first.",
                [("compile_kernel", kc("cpp_compile_error"))],
                reasoning="I will start with C++.",
            ),
            Reply(
                "Two calls at once.",
                [("compile_kernel", kc("torch_ok")), ("run_correctness", kc("torch_wrong"))],
            ),
            Reply("", [("run_correctness", kc("torch_ok"))], reasoning="The mask was missing."),
            Reply("Submitting.", [("submit_kernel", kc("torch_ok"))]),
        ]
    )
    out = tmp_path / "episodes"
    with FakeServer(script) as server:
        result = CliRunner().invoke(
            app,
            [
                "episode",
                "--problem",
                str(ANY_KERNEL_GQA),  # plain-PyTorch candidates: causal_gqa without its policy
                "--model",
                "scripted",
                "--base-url",
                server.base_url,
                "--out",
                str(out),
                "--device",
                "cpu",
                "--cache-dir",
                str(agent_cache),
                "--baselines",
                "eager",
                "--submit-trials",
                "1",
                "--submit-time",
                "0.3",
                "--benchmark-time",
                "0.3",
                "--max-tool-calls",
                "10",
                "--json",
            ],
            env={"KERNELJUDGE_MAX_RETRIES": "1"},
        )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "correct" and summary["stop_reason"] == "submitted"
    assert summary["submitted_by"] == "model" and summary["reward"] > 0
    assert summary["tool_calls"] == 5 and summary["turns"] == 4
    assert summary["prompt_tokens"] == 400 and summary["completion_tokens"] == 80

    path = Path(summary["transcript"])
    assert path.parent == out / "causal_gqa"
    recs = read_transcript(path)
    assert [r["type"] for r in recs] == (
        ["episode", "message", "message"]
        + ["assistant", "tool"]
        + ["assistant", "tool", "tool"]
        + ["assistant", "tool"] * 2
        + ["summary"]
    )
    assert recs[0]["model"] == "scripted" and "api_key" not in recs[0]["runner"]
    tools = [r for r in recs if r["type"] == "tool"]
    compile_error = tools[0]["observation"]
    assert compile_error.startswith("compile_kernel FAILED: compilation failed with 1 error")
    assert "kernel_code:22: error" in compile_error and "num_groups" in compile_error
    assert tools[1]["observation"].startswith("compile_kernel SUCCEEDED")
    assert tools[2]["observation"].startswith("run_correctness FAILED: (0 / 5) trials matched")
    assert "First mismatching elements" in tools[2]["observation"]
    assert tools[3]["observation"].startswith("run_correctness PASSED: (5 / 5) trials all matched")
    assert tools[4]["done"] and tools[4]["verdict"]["status"] == "correct"
    for t in tools:
        assert "[Budget: " in t["observation"].splitlines()[-1]
    assistants = [r for r in recs if r["type"] == "assistant"]
    assert assistants[0]["reasoning"] == "I will start with C++."
    assert assistants[0]["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
    }
    assert len(assistants[1]["tool_calls"]) == 2

    # the server saw the tools and got every observation back under its call id
    last = server.requests[-1]
    assert [t["function"]["name"] for t in last["tools"]] == [
        "compile_kernel",
        "run_correctness",
        "run_benchmark",
        "submit_kernel",
    ]
    tool_msgs = [m for m in last["messages"] if m["role"] == "tool"]
    ids = ["call_1_0", "call_2_0", "call_2_1", "call_3_0"]
    assert [m["tool_call_id"] for m in tool_msgs] == ids
    assert all("reasoning_content" not in m for m in last["messages"])
    summary_lines = (out / "summary.jsonl").read_text().splitlines()
    assert json.loads(summary_lines[-1])["episode_id"] == summary["episode_id"]


def test_budget_exhaustion_without_a_passing_kernel(
    agent_config: EnvConfig, tmp_path: Path
) -> None:
    script = by_turn([Reply("", [("compile_kernel", kc("torch_syntax_error"))])])
    with FakeServer(script) as server:
        summary = run_episode(
            "causal_gqa",
            runner(server.base_url),
            agent_config.replace(max_tool_calls=3),
            out_dir=tmp_path,
        )
    assert summary.stop_reason == "tool_calls_exhausted" and summary.status == "none"
    assert summary.reward == 0.0 and summary.tool_calls == 3 and summary.turns == 3
    tools = records(summary.transcript, "tool")
    assert "This is your last tool call" in tools[1]["observation"]
    assert "The budget is exhausted (no tool calls left)" in tools[2]["observation"]
    assert len(server.requests) == 3


def test_malformed_arguments_and_replies_without_tools(
    agent_config: EnvConfig, tmp_path: Path
) -> None:
    script = by_turn(
        [
            Reply("", [("compile_kernel", '{"kernel_code": "unterminated')]),
            Reply("", [("compile_kernel", '{"code": "x"}')]),
            Reply("", [("speed_up", "{}"), ("run_correctness", '{"kernel_code": 42}')]),
            Reply("I think I am done."),
            Reply("", [("compile_kernel", "{}")]),
        ]
    )
    with FakeServer(script) as server:
        summary = run_episode(
            "causal_gqa",
            runner(server.base_url),
            agent_config.replace(max_turns=5, on_exhausted="fail"),
            out_dir=tmp_path,
        )
    assert summary.stop_reason == "turns_exhausted" and summary.reward == 0.0
    obs = [t["observation"] for t in records(summary.transcript, "tool")]
    assert obs[0].startswith("compile_kernel ERROR: the arguments are not valid JSON")
    assert obs[1].startswith("compile_kernel ERROR: unknown argument 'code'")
    assert obs[2].startswith("ERROR: there is no tool 'speed_up'")
    assert obs[3].startswith("run_correctness ERROR: argument 'kernel_code' must be string")
    assert obs[4].startswith("compile_kernel ERROR: missing required argument 'kernel_code'")
    nudges = [m for m in records(summary.transcript, "message") if m["role"] == "user"][1:]
    assert len(nudges) == 1 and nudges[0]["content"].startswith("You did not call a tool")
    end = records(summary.transcript, "end")
    assert end and "no replies left" in end[0]["observation"]
    # the nudge went back to the server as a user message
    assert server.requests[4]["messages"][-1]["content"].startswith("You did not call a tool")


def test_reasoning_can_be_sent_back(agent_config: EnvConfig, tmp_path: Path) -> None:
    script = by_turn([Reply("", [("compile_kernel", kc("torch_syntax_error"))], reasoning="hmm")])
    with FakeServer(script) as server:
        run_episode(
            "causal_gqa",
            runner(server.base_url, reasoning_in_history=True),
            agent_config.replace(max_tool_calls=2),
            out_dir=tmp_path,
        )
    assistant = [m for m in server.requests[-1]["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "hmm"


def test_transient_errors_are_retried_and_refusals_stop(
    agent_config: EnvConfig, tmp_path: Path
) -> None:
    calls = {"n": 0}

    def flaky(body: dict[str, Any]) -> Reply | HttpError:
        calls["n"] += 1
        if calls["n"] == 1:
            return HttpError(503, "overloaded", {"Retry-After": "0"})
        if calls["n"] == 2:
            return Reply("", [("compile_kernel", kc("torch_syntax_error"))])
        return HttpError(400, "maximum context length exceeded")

    with FakeServer(flaky) as server:
        summary = run_episode("causal_gqa", runner(server.base_url), agent_config, out_dir=tmp_path)
    assert summary.stop_reason == "model_error" and "context length" in summary.error
    assert summary.reward == 0.0
    assistants = records(summary.transcript, "assistant")
    assert assistants[0]["attempts"] == 2
    assert records(summary.transcript, "end")[0]["stop_reason"] == "model_error"


def test_unreachable_server_stops_clearly(agent_config: EnvConfig, tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
    waits: list[float] = []
    client = ModelClient(runner(dead, max_retries=2), sleep=waits.append)
    with pytest.raises(ServerUnreachable, match=r"cannot reach the model server at .*3 attempts"):
        run_episode("causal_gqa", runner(dead), agent_config, out_dir=tmp_path, client=client)
    assert len(waits) == 2 and waits[1] >= waits[0] / 2
    (path,) = (tmp_path / "causal_gqa").glob("*.jsonl")
    summary = records(path, "summary")[0]
    assert summary["stop_reason"] == "server_unreachable"

    result = CliRunner().invoke(
        app,
        [
            "episode",
            "-p",
            "causal_gqa",
            "--model",
            "m",
            "--base-url",
            dead,
            "--out",
            str(tmp_path / "cli"),
            "--device",
            "cpu",
            "--max-retries",
            "0",
        ],
    )
    assert result.exit_code == 2
    assert "cannot reach the model server at http://127.0.0.1:9/v1" in result.output


def test_concurrent_episodes_write_their_own_transcripts(
    agent_config: EnvConfig, tmp_path: Path
) -> None:
    script = by_turn(
        [
            Reply(
                "",
                [
                    ("compile_kernel", kc("torch_syntax_error")),
                    ("compile_kernel", kc("torch_syntax_error")),
                ],
            ),
            Reply("", [("submit_kernel", '{"kernel_code": ""}')]),
        ]
    )
    with FakeServer(script) as server:
        summaries = run_episodes(
            ["causal_gqa"],
            runner(server.base_url),
            agent_config.replace(max_tool_calls=3),
            episodes=3,
            concurrency=3,
            out_dir=tmp_path,
        )
    assert len(summaries) == 3 and len({s.episode_id for s in summaries}) == 3
    assert all(s.stop_reason == "tool_calls_exhausted" for s in summaries)
    assert len((tmp_path / "summary.jsonl").read_text().splitlines()) == 3
    assert len(list((tmp_path / "causal_gqa").glob("*.jsonl"))) == 3
    assert len(server.requests) == 6


def test_model_client_needs_the_agent_extra_and_the_env_does_not() -> None:
    probe = (
        "import sys; sys.modules['openai'] = None\n"
        "import kerneljudge.env, kerneljudge.agent\n"
        "from kerneljudge.agent import replay\n"
        "import kerneljudge.agent.client\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith("the openai package is missing: install kerneljudge[agent]")


def test_an_unknown_problem_is_one_line_and_exit_2(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9/v1"  # never asked: the problem is checked first
    with pytest.raises(ProblemError, match="no problem named 'nosuch'"):
        run_episodes(["causal_gqa", "nosuch"], runner(dead), out_dir=tmp_path, client=None)
    args = ["episode", "-p", "nosuch", "--model", "m", "--base-url", dead]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "cli")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no problem named 'nosuch'")
    assert not (tmp_path / "cli" / "summary.jsonl").exists()

    broken = tmp_path / "broken_problem.py"  # a file that exists but is no problem
    broken.write_text("class Model(\n")
    result = CliRunner().invoke(
        app, [*args[:2], str(broken), *args[3:], "--out", str(tmp_path / "cli")]
    )
    assert result.exit_code == 1
    assert f"error: episode {broken}-0: " in result.stderr
    summary = json.loads((tmp_path / "cli" / "summary.jsonl").read_text())
    assert summary["stop_reason"] == "error" and summary["error"] in result.stderr
