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
