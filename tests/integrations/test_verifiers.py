"""verifiers: one scripted episode of ``load_environment`` end to end.

The model is a scripted OpenAI-compatible server on loopback (``tests/agent/fake_server.py``);
verifiers' interception server stands between it and the harness, as in a real run. The C++
candidate (``examples/causal_gqa/cpp_reference.py``) comes from the shared build cache.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "verifiers.v1", reason="verifiers is not installed (install kerneljudge[verifiers])"
)

import verifiers.v1 as vf  # noqa: E402

from kerneljudge.env import default_reward  # noqa: E402
from kerneljudge.integrations.verifiers import INFO_KEY, load_environment  # noqa: E402
from kerneljudge.verdict import Verdict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CPP = (REPO / "examples" / "causal_gqa" / "cpp_reference.py").read_text()


def _fake_server():
    spec = importlib.util.spec_from_file_location(
        "kj_fake_server", REPO / "tests" / "agent" / "fake_server.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_scripted_episode_rewards_the_verdict(shared_cache: Path, tmp_path: Path) -> None:
    fake = _fake_server()
    replies = [
        fake.Reply("Compile first.", [("compile_kernel", {"kernel_code": CPP})]),
        fake.Reply("Submitting.", [("submit_kernel", {"kernel_code": CPP})]),
    ]
    env = load_environment(
        problems="causal_gqa",
        max_turns=4,
        harness={"transcript_dir": str(tmp_path / "episodes")},
        device="cpu",
        cache_dir=str(shared_cache),
        baselines="eager",
        submit_shape_sets="public",
        submit_trials=1,
        submit_time_s=0.3,
        max_tool_calls=5,
    )
    (task,) = list(env.taskset)

    async def run(base_url: str) -> vf.Episode:
        client = vf.EvalClientConfig(base_url=base_url, api_key_var="KERNELJUDGE_TEST_NO_KEY")
        ctx = vf.ModelContext(model="scripted", client=client)
        async with env.serving():
            return await env.run_episode(task, ctx)

    with fake.FakeServer(fake.by_turn(replies)) as server:
        episode = asyncio.run(run(server.base_url))
    (trace,) = episode.traces
    assert trace.ok and episode.ok, (trace.errors, episode.errors, trace.stop_condition)
    assert len(server.requests) == 2  # both replies went through the interception
    tools = [t["function"]["name"] for t in server.requests[0]["tools"]]
    assert tools == ["compile_kernel", "run_correctness", "run_benchmark", "submit_kernel"]
    result = trace.info[INFO_KEY]
    assert result["status"] == "correct" and result["submitted_by"] == "model"
    assert result["tool_calls"] == 2 and result["turns"] == 2
    expected = default_reward(Verdict.from_dict(result["verdict"]))
    assert 0.0 < expected <= 1.0 and result["reward"] == pytest.approx(expected)
    assert trace.rewards["kernel_reward"].value == pytest.approx(expected)
    assert trace.metrics["correct"] == 1.0 and trace.metrics["speedup_eager"] > 0
    tool_observations = [
        r["observation"] for r in _records(Path(result["transcript"])) if r.get("type") == "tool"
    ]
    assert tool_observations[0].startswith("compile_kernel SUCCEEDED")
    assert tool_observations[1].startswith("submit_kernel: CORRECT")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
