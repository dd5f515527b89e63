"""Durable episode runs: state recorded as it goes, kill -9 and --resume, cleanup, and model
output of every malformed kind ending as an observation (or a recorded failure), never as an
exception. Real HTTP (fake_server.py), real runner processes, real judges on the smoke problem.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_server import Answer, FakeServer, Hang, HttpError, RawBody, Reply, by_turn

from kerneljudge.agent import RunnerConfig, read_transcript, resume_episodes, run_episode
from kerneljudge.agent.client import ServerUnreachable
from kerneljudge.agent.runlog import RunLog, read_jsonl
from kerneljudge.agent.runs import run_episodes
from kerneljudge.env import EnvConfig
from kerneljudge.env._tool import MAX_ARGUMENT_CHARS
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "tests" / "fixtures" / "smoke" / "problem.py"
CANDIDATE = (REPO / "tests" / "fixtures" / "smoke" / "candidate.py").read_text()
GOOD = {"kernel_code": CANDIDATE}


@pytest.fixture(scope="module")
def smoke_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smoke-cache")


@pytest.fixture(scope="module")
def smoke_config(smoke_cache: Path) -> EnvConfig:
    return EnvConfig(
        device="cpu",
        cache_dir=str(smoke_cache),
        baselines=("eager",),
        trials=1,
        submit_trials=1,
        benchmark_time_s=0.05,
        submit_time_s=0.05,
        profile=False,
        max_tool_calls=2,
        on_exhausted="fail",
    )


@pytest.fixture(scope="module")
def smoke_judge(smoke_cache: Path) -> Iterator[Judge]:
    config = JudgeConfig(
        device="cpu",
        cache_dir=smoke_cache,
        threads=1,
        timing_config=TimingConfig(max_time_s=0.05, min_samples=5, warmup_calls=1),
    )
    with Judge(SMOKE, config) as judge:
        yield judge


def runner(base_url: str, **kw: Any) -> RunnerConfig:
    kw = {"max_retries": 2, **kw}
    return RunnerConfig(model="scripted", base_url=base_url, backoff_s=0.01, **kw)


def _processes_in(roots: list[str]) -> list[int]:
    """Processes whose working folder is inside one of ``roots`` (a run's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if any(cwd == r or cwd.startswith(r + os.sep) for r in roots):
            found.append(int(entry))
    return found


# ---------------------------------------------------------------- kill -9 and --resume


def _flaky(seed: int) -> Any:
    """Replies by turn (compile_kernel, then submit_kernel); 30% of answers fail: a 500, a
    hang past the client's timeout, or a body that is not JSON."""
    rng = random.Random(seed)
    lock = threading.Lock()
    script = by_turn(
        [Reply("", [("compile_kernel", GOOD)]), Reply("Submitting.", [("submit_kernel", GOOD)])]
    )
    failures: list[Answer] = [HttpError(500, "overloaded"), Hang(3.0), RawBody(b"\xff<html>")]

    def policy(body: dict[str, Any]) -> Answer:
        with lock:
            roll, pick = rng.random(), rng.randrange(3)
        return failures[pick] if roll < 0.3 else script(body)

    return policy


def _cli(out: Path, server: FakeServer, cache: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = [
        sys.executable,
        "-m",
        "kerneljudge",
        "episode",
        "--model",
        "scripted",
        "--base-url",
        server.base_url,
        "--device",
        "cpu",
        "--cache-dir",
        str(cache),
        "--baselines",
        "eager",
        "--trials",
        "1",
        "--submit-trials",
        "1",
        "--submit-time",
        "0.05",
        "--benchmark-time",
        "0.05",
        "--no-profile",
        "--max-retries",
        "8",
        "--backoff",
        "0.01",
        "--request-timeout",
        "1.5",
        "--concurrency",
        "3",
        "--json",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )


def _kill_when(proc: subprocess.Popen[bytes], log: RunLog, ended: int) -> None:
    """SIGKILL the runner once ``ended`` episodes have ended and another is partway."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        if log.plan_path.exists():
            states = log.states()
            done = sum(s.state in ("finished", "failed") for s in states)
            if done >= ended and any(s.state == "partial" for s in states):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
                return
        time.sleep(0.05)
    raise AssertionError("the run did not get there in 10 minutes")


@pytest.mark.slow
def test_killed_twice_and_resumed_judges_every_episode_once(
    smoke_cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    log = RunLog(out)
    with FakeServer(_flaky(seed=7)) as server:
        first = _cli(
            out, server, smoke_cache, "-p", str(SMOKE), "--episodes", "24", "--out", str(out)
        )
        _kill_when(first, log, ended=3)
        states = log.states()
        assert len(states) == 24  # the plan was on disk before the first episode started
        assert any(s.state == "planned" for s in states)
        assert any(s.state == "partial" and s.steps >= 1 for s in states)
        (dead,) = [r["tmp"] for r in log.run_records()]
        assert Path(dead).is_dir()  # what the killed run left, its own

        second = _cli(out, server, smoke_cache, "--resume", str(out))
        _kill_when(second, log, ended=10)
        third = _cli(out, server, smoke_cache, "--resume", str(out))
        stdout, stderr = third.communicate(timeout=900)
    assert third.returncode in (0, 1), stderr.decode()[-3000:]

    # exactly one summary per episode, every one accounted for
    lines = read_jsonl(out / "summary.jsonl")
    assert len(lines) == 24 and len({line["slot"] for line in lines}) == 24
    assert all(line["state"] in ("finished", "failed") for line in lines)
    assert len([json.loads(x) for x in stdout.decode().splitlines()]) == 24
    submitted = [line for line in lines if line["stop_reason"] == "submitted"]
    assert len(submitted) >= 20  # 30% failures are retried; few episodes end on one
    for line in lines:
        if line["state"] == "failed":
            assert line["error"]
    # each episode judged once: one submit verdict in its transcript, and none elsewhere
    # than in transcripts of interrupted attempts
    verdicts = 0
    for line in lines:
        tools = [r for r in read_transcript(line["transcript"]) if r["type"] == "tool"]
        subs = [t for t in tools if t["name"] == "submit_kernel" and t["verdict"]]
        assert len(subs) == (1 if line["stop_reason"] == "submitted" else 0)
        verdicts += len(subs)
    assert verdicts == len(submitted)
    # the interrupted attempts are kept, marked, and not counted
    interrupted = sorted(out.glob("smoke_affine/*.interrupted.jsonl"))
    assert len(interrupted) >= 2
    for path in interrupted:
        records = read_jsonl(path)
        assert records[0]["type"] == "episode" and records[-1]["type"] == "interrupted"
        assert not any(r["type"] == "summary" for r in records)
    finals = {Path(line["transcript"]).name for line in lines}
    assert not finals & {p.name for p in interrupted}
    events = read_jsonl(out / "state.jsonl")
    assert sum(e["event"] == "interrupted" for e in events) == len(interrupted)
    assert {e["slot"] for e in events if e["event"] == "planned"} == {x["slot"] for x in lines}

    # no temporary folder, no worker left by any of the three runner processes
    tmps = [r["tmp"] for r in log.run_records()]
    assert len(tmps) == 3
    assert not [t for t in tmps if Path(t).exists()]
    assert _processes_in(tmps) == []


def test_an_unreachable_server_is_a_failed_summary_and_the_rest_stays_planned(
    smoke_config: EnvConfig, tmp_path: Path
) -> None:
    dead = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
    with pytest.raises(ServerUnreachable):
        run_episodes(
            [str(SMOKE)], runner(dead, max_retries=0), smoke_config, episodes=2, out_dir=tmp_path
        )
    log = RunLog(tmp_path)
    first, second = log.states()
    assert first.state == "failed" and "cannot reach the model server" in first.reason
    assert second.state == "planned"
    (line,) = read_jsonl(tmp_path / "summary.jsonl")
    assert line["stop_reason"] == "server_unreachable" and line["state"] == "failed"
    assert not Path(log.run_records()[0]["tmp"]).exists()

    script = by_turn([Reply("", [("submit_kernel", GOOD)])])
    with FakeServer(script) as server:
        # a new run may not take over a folder whose run has episodes left
        with pytest.raises(RuntimeError, match="holds an unfinished run .1 episodes not ended"):
            run_episodes([str(SMOKE)], runner(server.base_url), smoke_config, out_dir=tmp_path)
        summaries = resume_episodes(tmp_path, runner(server.base_url))
        assert [s.stop_reason for s in summaries] == ["server_unreachable", "submitted"]
        assert len(read_jsonl(tmp_path / "summary.jsonl")) == 2
        assert len(server.requests) == 1  # the failed episode was not run again
        # once it has ended, a later run in the same folder has slots of its own
        (later,) = run_episodes(
            [str(SMOKE)], runner(server.base_url), smoke_config, out_dir=tmp_path
        )
    assert later.stop_reason == "submitted"
    lines = read_jsonl(tmp_path / "summary.jsonl")
    assert len(lines) == 3 and len({line["slot"] for line in lines}) == 3
    assert [s.state for s in RunLog(tmp_path).states()] == ["finished"]


# ---------------------------------------------------------------- malformed model output


def _episode(
    replies: list[Answer], config: EnvConfig, judge: Judge, tmp_path: Path
) -> tuple[Any, FakeServer, list[dict[str, Any]]]:
    """One episode: the malformed reply, then a compile_kernel of good code (two tool calls,
    ``fail`` on exhaustion: no candidate runs); returns the summary, the server, the tool
    records."""
    replies = [*replies, Reply("", [("compile_kernel", GOOD)])]
    with FakeServer(by_turn(replies)) as server:
        summary = run_episode(SMOKE, runner(server.base_url), config, out_dir=tmp_path, judge=judge)
    tools = [r for r in read_transcript(summary.transcript) if r["type"] == "tool"]
    return summary, server, tools


def _fed_back(server: FakeServer, text: str) -> bool:
    """The model got ``text`` back in a tool message of a later request."""
    return any(
        m["role"] == "tool" and text in m["content"] for m in server.requests[-1]["messages"]
    )


def test_a_lone_surrogate_in_the_arguments(
    smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path
) -> None:
    escaped = Reply("", [("compile_kernel", '{"kernel_code": "x = 1  # \\udcff"}')])
    summary, server, tools = _episode([escaped], smoke_config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    assert tools[0]["outcome"] == "tool_error"
    assert "not valid Unicode text (a lone surrogate)" in tools[0]["observation"]
    assert _fed_back(server, "lone surrogate")
    assert tools[1]["observation"].startswith("compile_kernel SUCCEEDED")


def test_a_reply_body_that_is_not_utf8(
    smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path
) -> None:
    arguments = json.dumps({"kernel_code": CANDIDATE + "# @\n"}, ensure_ascii=False)
    call = {"id": "c1", "function": {"name": "compile_kernel", "arguments": arguments}}
    body = {"choices": [{"message": {"content": "Here it is: @", "tool_calls": [call]}}]}
    text = json.dumps(body, ensure_ascii=False).replace("@", "\udcff")
    raw = text.encode("utf-8", "surrogateescape")  # the lone byte 0xff, twice
    assert b"\xff" in raw
    summary, server, tools = _episode([RawBody(raw)], smoke_config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    # the bytes that are not UTF-8 became U+FFFD; the reply itself went through
    assistant = [r for r in read_transcript(summary.transcript) if r["type"] == "assistant"]
    assert assistant[0]["content"] == "Here it is: \ufffd"
    assert tools[0]["name"] == "compile_kernel" and tools[0]["outcome"] == "built"
    assert server.requests[1]["messages"][2]["content"] == "Here it is: \ufffd"


def test_a_body_that_is_no_json_is_retried_then_a_recorded_failure(
    smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path
) -> None:
    with FakeServer(by_turn([RawBody(b"<html>502 Bad Gateway</html>")])) as server:
        summary = run_episode(
            SMOKE, runner(server.base_url), smoke_config, out_dir=tmp_path, judge=smoke_judge
        )
    assert summary.stop_reason == "model_error" and "the body is not JSON" in summary.error
    assert len(server.requests) == 3  # one request and its two retries
    end = [r for r in read_transcript(summary.transcript) if r["type"] == "end"]
    assert end and end[0]["stop_reason"] == "model_error"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"kernel_code": "unterminated', "compile_kernel ERROR: the arguments are not valid JSON"),
        ("[1, 2]", "compile_kernel ERROR: the arguments must be a JSON object"),
        ('"just a string"', "compile_kernel ERROR: the arguments must be a JSON object"),
        ("[" * 200_000, "compile_kernel ERROR: the arguments nest too deeply"),
        ('{"kernel_code": 7}', "compile_kernel ERROR: argument 'kernel_code' must be string"),
        ("{}", "compile_kernel ERROR: missing required argument 'kernel_code'"),
    ],
    ids=["not-json", "array", "string", "deep", "wrong-type", "missing-argument"],
)
def test_arguments_that_are_not_a_usable_object(
    arguments: str,
    expected: str,
    smoke_config: EnvConfig,
    smoke_judge: Judge,
    tmp_path: Path,
) -> None:
    reply = Reply("", [("compile_kernel", arguments)])
    summary, server, tools = _episode([reply], smoke_config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    assert tools[0]["observation"].startswith(expected)
    assert _fed_back(server, expected)


def test_a_huge_argument(smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path) -> None:
    huge = json.dumps({"kernel_code": "# " + "x" * MAX_ARGUMENT_CHARS})
    reply = Reply("", [("compile_kernel", huge)])
    summary, server, tools = _episode([reply], smoke_config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    assert tools[0]["observation"].startswith("compile_kernel ERROR: the arguments are ")
    assert f"the limit is {MAX_ARGUMENT_CHARS:,}" in tools[0]["observation"]


def test_an_unknown_tool(smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path) -> None:
    reply = Reply("", [("make_it_fast\udcff", "{}")])
    summary, server, tools = _episode([reply], smoke_config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    assert tools[0]["observation"].startswith("ERROR: there is no tool 'make_it_fast\ufffd'")
    assert _fed_back(server, "there is no tool")


def test_tool_calls_with_missing_fields(
    smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path
) -> None:
    body = {
        "choices": [
            {
                "message": {
                    "tool_calls": [
                        {"id": "no-function"},
                        {"function": {"arguments": "{}"}},
                        {"function": {"name": "compile_kernel", "arguments": GOOD}},
                    ]
                }
            }
        ],
        "usage": "none",
    }
    raw = RawBody(json.dumps(body).encode())
    config = smoke_config.replace(max_tool_calls=4)
    summary, server, tools = _episode([raw], config, smoke_judge, tmp_path)
    assert summary.stop_reason == "tool_calls_exhausted" and not summary.error
    assert [t["observation"].split(";")[0] for t in tools[:2]] == [
        "ERROR: the call names no tool"
    ] * 2
    # arguments sent as a JSON object rather than its text are read all the same
    assert tools[2]["observation"].startswith("compile_kernel SUCCEEDED")
    ids = [m.get("tool_call_id") for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert len(ids) == 3 and ids[0] == "no-function" and all(ids)


def test_a_reply_with_no_choices_or_no_message(
    smoke_config: EnvConfig, smoke_judge: Judge, tmp_path: Path
) -> None:
    replies: list[Answer] = [RawBody(b'{"choices": []}')]
    with FakeServer(by_turn(replies)) as server:
        summary = run_episode(
            SMOKE, runner(server.base_url), smoke_config, out_dir=tmp_path, judge=smoke_judge
        )
    assert summary.stop_reason == "model_error" and "no choices" in summary.error
    replies = [RawBody(b'{"choices": [{"message": null}]}'), Reply("", [("compile_kernel", GOOD)])]
    calls = {"n": 0}

    def second(body: dict[str, Any]) -> Answer:
        calls["n"] += 1
        return replies[0] if calls["n"] == 1 else replies[1]

    with FakeServer(second) as server:
        summary = run_episode(
            SMOKE, runner(server.base_url), smoke_config, out_dir=tmp_path, judge=smoke_judge
        )
    assert summary.stop_reason == "tool_calls_exhausted"  # retried, then the episode went on
    assistant = [r for r in read_transcript(summary.transcript) if r["type"] == "assistant"]
    assert assistant[0]["attempts"] == 2


def test_resume_recovers_a_summary_left_in_its_transcript_and_cuts_torn_lines(
    smoke_config: EnvConfig, tmp_path: Path
) -> None:
    """A kill between an episode's transcript summary and its summary.jsonl line, and torn
    last lines in state.jsonl and summary.jsonl (hand-made: what a kill can leave)."""
    log = RunLog(tmp_path)
    slots = [{"slot": f"r/{k}", "problem": str(SMOKE), "index": k} for k in range(2)]
    log.write_plan(
        {
            "run_id": "r",
            "problems": [str(SMOKE)],
            "episodes": 2,
            "slots": slots,
            "env_config": smoke_config.to_dict(),
            "runner": {},
        }
    )
    done = {"episode_id": "e0", "problem": "smoke_affine", "model": "m", "status": "correct"}
    done |= {"reward": 1.0, "speedup_eager": 1.0, "speedup_compile": None}
    done |= {"submitted_by": "model", "stop_reason": "submitted", "tool_calls": 1, "turns": 1}
    done |= {"prompt_tokens": 1, "completion_tokens": 1, "duration_s": 1.0, "error": ""}
    log.add_summary("r/0", {**done, "transcript": "x"}, "finished")
    transcript = tmp_path / "smoke_affine" / "e1.jsonl"
    transcript.parent.mkdir()
    summary1 = {"type": "summary", **done, "episode_id": "e1", "transcript": str(transcript)}
    transcript.write_text(json.dumps({"type": "episode"}) + "\n" + json.dumps(summary1) + "\n")
    log.event("r/1", "started", episode_id="e1", transcript="smoke_affine/e1.jsonl")
    with open(log.state_path, "a") as f:
        f.write('{"slot": "r/1", "event": "st')  # torn by a kill
    with open(log.summary_path, "a") as f:
        f.write('{"episode_id": "e9", "slo')
    assert [s.state for s in log.states()] == ["finished", "started"]

    dead = "http://127.0.0.1:9/v1"  # never asked: nothing is left to run
    summaries = resume_episodes(tmp_path, runner(dead))
    assert [s.episode_id for s in summaries] == ["e0", "e1"]
    lines = (tmp_path / "summary.jsonl").read_text().splitlines()
    assert [json.loads(line)["slot"] for line in lines] == ["r/0", "r/1"]  # torn line cut off
    events = [json.loads(line) for line in log.state_path.read_text().splitlines()]
    assert [e["event"] for e in events if e.get("slot") == "r/1"][-2:] == ["recovered", "finished"]
    assert [s.state for s in log.states()] == ["finished", "finished"]


def test_cleanup_removes_only_a_runs_own_temporary_folder(tmp_path: Path) -> None:
    """A run folder's record names the folder a resume cleans: a path that is not a run's own
    (edited or copied from elsewhere) is left alone, processes and files included."""
    import tempfile

    from kerneljudge.agent.runlog import cleanup_tmp

    other = tmp_path / "home"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    cleanup_tmp(other)
    assert (other / "keep.txt").exists()
    own = Path(tempfile.mkdtemp(prefix="kj-run-"))
    (own / "w").write_text("x")
    cleanup_tmp(own)
    assert not own.exists()
