"""The seed problems require the custom kernel their agent prompts ask for."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.candidate.policy import (
    CUSTOM_KERNEL_REQUIRED,
    cpp_ops_called,
    forbidden_ops_used,
    requires_custom_kernel,
    static_issues,
)
from kerneljudge.env import observations
from kerneljudge.problem import Problem

SEEDS = ("causal_gqa", "mla_kv_projection", "triangle_attention")
TORCH_OK = Path(__file__).parent / "env" / "candidates" / "torch_ok.py"


@pytest.mark.parametrize("name", SEEDS)
def test_seed_problems_require_a_custom_kernel(name: str) -> None:
    assert requires_custom_kernel(Problem.load(name).policy)


def test_a_plain_pytorch_candidate_is_rejected_with_the_reason_and_a_hint(tmp_path: Path) -> None:
    config = JudgeConfig(device="cpu", cache_dir=tmp_path, timing=False, trials=1, threads=1)
    with Judge("causal_gqa", config) as judge:
        verdict = judge.evaluate(TORCH_OK)
    assert verdict.status is Status.REJECTED
    assert verdict.reason.startswith(CUSTOM_KERNEL_REQUIRED) and "plain PyTorch" in verdict.reason
    text = observations.check_text("run_correctness", verdict)
    assert text.startswith("run_correctness FAILED: rejected: " + CUSTOM_KERNEL_REQUIRED)
    assert "load_inline" in text and "not even as a fallback" in text


def test_triangle_attention_forbids_its_core_not_its_projections() -> None:
    policy = Problem.load("triangle_attention").policy
    ran = ["native_layer_norm", "addmm", "mm", "sigmoid", "_softmax", "bmm"]
    assert forbidden_ops_used(ran, policy) == ["_softmax", "bmm"]
    cpp = (
        'src = """\n#include <torch/extension.h>\n'
        'auto f(at::Tensor x) { return at::mm(x, x); }\n"""\n'
    )
    assert cpp_ops_called(cpp) == ["mm"]
    assert static_issues(cpp, "cpp", policy) == []
    assert static_issues(cpp, "cpp", Problem.load("causal_gqa").policy)
