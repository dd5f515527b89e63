"""Inspect AI: a scripted episode of ``kernel_task`` end to end with Inspect's mock model.

The C++ candidate (``examples/causal_gqa/cpp_reference.py``) comes from the shared build cache,
so the episode runs no compiler when the cache holds it (the first run on a machine builds it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

inspect_ai = pytest.importorskip(
    "inspect_ai", reason="inspect-ai is not installed (install kerneljudge[inspect])"
)

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model  # noqa: E402

from kerneljudge.env import TOOL_NAMES, default_reward  # noqa: E402
from kerneljudge.integrations.inspect import RESULT_KEY  # noqa: E402
from kerneljudge.verdict import Verdict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASK_FILE = REPO / "src" / "kerneljudge" / "integrations" / "inspect.py"
CPP = (REPO / "examples" / "causal_gqa" / "cpp_reference.py").read_text()


@pytest.mark.slow
def test_scripted_episode_scores_the_verdicts_reward(shared_cache: Path, tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    script = [
        ("compile_kernel", {"kernel_code": CPP}),
        ("submit_kernel", {"kernel_code": CPP}),
    ]

    def reply(messages, tools, tool_choice, config) -> ModelOutput:
        seen.append({"tools": [t.name for t in tools], "messages": len(messages)})
        name, args = script[len(seen) - 1]
        out = ModelOutput.for_tool_call("mockllm/model", name, args, tool_call_id=f"c{len(seen)}")
        # Usage given, so the mock model does not count tokens (tiktoken downloads its tables).
        out.usage = ModelUsage(input_tokens=100, output_tokens=20, total_tokens=120)
        return out

    logs = inspect_eval(
        f"{TASK_FILE}@kernel_task",
        task_args={
            "problem": "causal_gqa",
            "device": "cpu",
            "cache_dir": str(shared_cache),
            "baselines": "eager",
            "submit_shape_sets": "public",
            "submit_trials": 1,
            "submit_time_s": 0.3,
            "max_tool_calls": 5,
        },
        model=get_model("mockllm/model", custom_outputs=reply),
        log_dir=str(tmp_path / "logs"),
        display="none",
    )
    (log,) = logs
    assert log.status == "success", log.error
    (sample,) = log.samples
    assert seen[0]["tools"] == list(TOOL_NAMES) and len(seen) == 2
    result = sample.store[RESULT_KEY]
    assert result["status"] == "correct" and result["submitted_by"] == "model"
    assert result["tool_calls"] == 2 and result["turns"] == 2
    verdict = Verdict.from_dict(json.loads(json.dumps(result["verdict"])))
    expected = default_reward(verdict)
    assert 0.0 < expected <= 1.0
    (score,) = sample.scores.values()
    assert score.value == pytest.approx(expected) and score.answer == "correct"
    assert log.results.scores[0].metrics["mean"].value == pytest.approx(expected)
    tool_messages = [m for m in sample.messages if m.role == "tool"]
    assert tool_messages[0].text.startswith("compile_kernel SUCCEEDED")
    assert tool_messages[1].text.startswith("submit_kernel: CORRECT")


def test_replies_without_tool_calls_end_under_the_budget_policy(tmp_path: Path) -> None:
    def reply(messages, tools, tool_choice, config) -> ModelOutput:
        out = ModelOutput.from_content("mockllm/model", "I would rather not write a kernel.")
        out.usage = ModelUsage(input_tokens=100, output_tokens=20, total_tokens=120)
        return out

    (log,) = inspect_eval(
        f"{TASK_FILE}@kernel_task",
        task_args={"problem": "causal_gqa", "device": "cpu", "max_turns": 2},
        model=get_model("mockllm/model", custom_outputs=reply),
        log_dir=str(tmp_path / "logs"),
        display="none",
    )
    assert log.status == "success", log.error
    (sample,) = log.samples
    result = sample.store[RESULT_KEY]
    assert result["stop_reason"] == "turns_exhausted" and result["turns"] == 2
    assert result["status"] == "none" and result["verdict"] is None
    (score,) = sample.scores.values()
    assert score.value == 0.0 and score.answer == "none"
    reminders = [m.text for m in sample.messages if m.role == "user"][1:]
    assert len(reminders) == 3  # a reminder after each reply, then the end of the episode
    assert "no kernel passed run_correctness" in reminders[-1]
