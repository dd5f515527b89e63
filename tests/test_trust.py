"""Cheats and escapes that must be rejected (CPU tier; the full suite is tests/adversarial/)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig
from kerneljudge.candidate.policy import cpp_ops_called, static_issues

CANDIDATES = Path(__file__).parent / "fixtures" / "candidates"


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory):
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path_factory.mktemp("cache"),
        run_timeout_s=8.0,
        baselines=("eager",),
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    with Judge(Path(__file__).parent / "fixtures" / "tiny_problem.py", config) as j:
        yield j


@pytest.mark.parametrize(
    "name, words",
    [
        ("inplace_input.py", "changed its input 0 in place"),
        ("input_view.py", "view of one of its inputs"),
        ("init_escape.py", "outside the scratch folder"),
        ("network.py", "network"),
        ("lingering_thread.py", "thread(s) running after the call"),
        ("hidden_thread.py", "started outside the threading module"),
    ],
)
def test_rejected(judge: Judge, name: str, words: str) -> None:
    v = judge.evaluate(CANDIDATES / name)
    assert v.status is Status.REJECTED, v.reason
    assert words in v.reason
    assert not glob.glob("/var/tmp/kj-escape-*")


def test_output_flood_is_a_runtime_error_and_the_judge_goes_on(judge: Judge) -> None:
    v = judge.evaluate(CANDIDATES / "floods_stdout.py")
    assert v.status is Status.RUNTIME_ERROR
    assert "wrote more than 16 MiB of output" in v.reason
    assert judge.evaluate(CANDIDATES / "good.py").status is Status.CORRECT


def test_reference_in_disguise_in_cpp_source() -> None:
    src = (
        'cpp = """\n#include <torch/extension.h>\n'
        'auto f(at::Tensor a) { return at::mm(a, a); }\n"""\n'
    )
    assert cpp_ops_called(src) == ["mm"]
    issues = static_issues(src + "class ModelNew(Model): pass\n", "cpp")
    assert any("calls PyTorch's own mm" in i for i in issues)
    assert any("inherits the reference Model" in i for i in issues)


_THREADED_REFERENCE = """
import threading
import time

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        threading.Thread(target=time.sleep, args=(0.02,)).start()  # still running at return
        return x * 2


def get_inputs():
    return [torch.rand(8, 8)]


def get_init_inputs():
    return []
"""


def test_a_thread_left_by_the_reference_is_the_references_not_its_identitys(
    tmp_path: Path,
) -> None:
    """Both workers' timed loops check for a thread left running after each call (so each call
    follows the same work on both sides): a reference that leaves one fails the verdict as the
    reference's failure; its own code as the candidate was rejected for it before."""
    problem, candidate = tmp_path / "threaded.py", tmp_path / "identity.py"
    problem.write_text(_THREADED_REFERENCE)
    candidate.write_text(_THREADED_REFERENCE.replace("class Model(", "class ModelNew("))
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path / "cache",
        run_timeout_s=8.0,
        baselines=("eager",),
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    with Judge(problem, config) as j:
        v = j.evaluate(candidate)
    assert v.status is Status.RUNTIME_ERROR, v.reason
    assert "the reference of threaded failed on time" in v.reason
    assert "thread(s) running after the call" in v.reason
