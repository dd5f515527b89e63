"""Episodes judged through the judge service: ``KernelEnv(..., server=URL)`` and ``kerneljudge
episode --server``. A real ``kerneljudge serve`` process on loopback (with a token), real HTTP,
real judging of the smoke problem on the CPU; the episode's model a scripted loopback server
(tests/agent/fake_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: service.conftest
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # fake_server

from fake_server import FakeServer, Reply, by_turn  # noqa: E402
from service.conftest import GOOD, SMOKE, SRC, TOKEN, WRONG, Server  # noqa: E402

from kerneljudge.device import describe_device  # noqa: E402
from kerneljudge.env import EnvConfig, KernelEnv, ToolCall  # noqa: E402
from kerneljudge.env.remote import PROFILE_NOTE, RemoteJudge  # noqa: E402
from kerneljudge.service.client import JudgeClient  # noqa: E402
from kerneljudge.verdict import Status  # noqa: E402

CUDA = (
    "from torch.utils.cpp_extension import load_inline\n"
    "x = load_inline(name='a', cpp_sources='', cuda_sources='__global__ void k(){}')\n"
    "class ModelNew: pass\n"
)
SYNTAX_ERROR = (
    Path(__file__).resolve().parent / "candidates" / "torch_syntax_error.txt"
).read_text()
CONFIG = EnvConfig(
    device="cpu",
    baselines=("eager",),
    trials=2,
    submit_trials=1,
    benchmark_time_s=0.3,
    submit_time_s=0.3,
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("remote-env") / "jobs.sqlite"
    srv = Server(db, ["--cpu-slots", "1", "--max-in-flight", "1"]).start()
    yield srv
    srv.stop()


def _done(server: Server) -> int:
    with JudgeClient(server.url, token=TOKEN, timeout_s=120.0) as client:
        return int(client.metrics()["states"]["done"])


def _call(tool: str, code: str) -> ToolCall:
    return ToolCall(tool, {"kernel_code": code})


def test_a_scripted_episode_through_the_service(service: Server) -> None:
    before = _done(service)
    problem = SMOKE / "problem.py"
    with KernelEnv(
        problem, CONFIG, server=service.url, token=TOKEN, server_problem="problem.py"
    ) as env:
        task = env.reset()
        # the device the service judges on (this machine's CPU), asked of the service
        info = env.session.device_info()
        assert info.kind == "cpu" and info.name == describe_device("cpu").name
        assert f"on the CPU ({info.name})" in task.system

        built = env.step(_call("compile_kernel", GOOD))
        assert built.observation.startswith("compile_kernel SUCCEEDED: the torch candidate passed")
        assert built.info.outcome == "built" and built.info.build is not None

        broken = env.step(_call("compile_kernel", SYNTAX_ERROR))  # as the local judge says it
        assert broken.observation.startswith("compile_kernel FAILED: compilation failed with 1 ")
        assert "kernel_code:10" in broken.observation
        assert broken.info.build is not None and not broken.info.build.ok

        wrong = env.step(_call("run_correctness", WRONG))
        assert wrong.observation.startswith("run_correctness FAILED: (0 / 2) trials matched")
        assert wrong.info.verdict is not None and wrong.info.verdict.status is Status.INCORRECT

        ok = env.step(_call("run_correctness", GOOD))
        assert ok.observation.startswith("run_correctness PASSED: (2 / 2) trials all matched")
        assert env.state.last_passing_code == GOOD

        bench = env.step(_call("run_benchmark", GOOD))
        assert bench.observation.startswith("run_benchmark: correct (1 / 1 trials). Timing on ")
        assert f"Profile: not available ({PROFILE_NOTE})." in bench.observation

        cuda = env.step(_call("run_correctness", CUDA))  # refused here: no job
        assert "needs a CUDA GPU" in cuda.observation and cuda.info.outcome == "tool_error"

        final = env.step(_call("submit_kernel", GOOD))
        assert final.done and final.info.submitted_by == "model"
        verdict = final.info.verdict
        assert verdict is not None and verdict.status is Status.CORRECT, verdict.reason
        assert verdict.timing is not None and final.reward is not None
        assert env.final_verdict is not None and env.final_verdict.status is Status.CORRECT
        judge = env.session.judge
        assert isinstance(judge, RemoteJudge)
        # the device probe, two compiles, two checks, benchmark, submit: each a service job
        assert judge.jobs == 7
    assert _done(service) == before + 7


def test_a_problem_the_service_cannot_load_is_an_error_not_a_verdict(service: Server) -> None:
    from kerneljudge.errors import KernelJudgeError

    with KernelEnv(
        SMOKE / "problem.py", CONFIG, server=service.url, token=TOKEN, server_problem="nope.py"
    ) as env:
        with pytest.raises(KernelJudgeError, match="422: "):
            env.session.judge.judge(
                env._ctx.candidate("run_correctness", GOOD),
                env.session._options(trials=1, timing=False),
            )
    with pytest.raises(ValueError, match="a judge or a server"):
        KernelEnv(SMOKE / "problem.py", CONFIG, server=service.url, judge=object())  # type: ignore[arg-type]


def test_episode_command_judges_through_the_service(service: Server, tmp_path: Path) -> None:
    before = _done(service)
    script = by_turn(
        [
            Reply("", [("run_correctness", {"kernel_code": GOOD})]),
            Reply("", [("submit_kernel", {"kernel_code": GOOD})]),
        ]
    )
    env = dict(os.environ, PYTHONPATH=str(SRC), KERNELJUDGE_TOKEN=TOKEN)
    with FakeServer(script) as model:
        cmd = [sys.executable, "-m", "kerneljudge", "episode", "-p", "problem.py"]
        cmd += ["--model", "scripted", "--base-url", model.base_url, "--server", service.url]
        cmd += ["--device", "cpu", "--trials", "2", "--submit-trials", "1"]
        cmd += ["--submit-time", "0.3", "--no-profile", "--out", str(tmp_path), "--json"]
        # run where the problem file is: the trainer side reads it for the prompt, the
        # service knows it by the same relative name under its --problems-dir
        run = subprocess.run(
            cmd, cwd=SMOKE, env=env, capture_output=True, text=True, timeout=600, check=False
        )
    assert run.returncode == 0, run.stderr
    (summary,) = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    assert summary["stop_reason"] == "submitted" and summary["status"] == "correct", summary
    # the device probe, run_correctness and submit_kernel were the service's jobs
    assert _done(service) == before + 3
    plan = json.loads((tmp_path / "run.json").read_text())
    assert plan["server"] == service.url and TOKEN not in json.dumps(plan)
