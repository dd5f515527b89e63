"""The problem lint: every bundled problem is sound, and degenerate problems are caught.

The bundled problems are linted on the CPU at their smallest shape set (``tiny`` where they have
one), as CI does; the whole file runs in well under a minute on two cores.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from kerneljudge.lint import (
    CHECK_NAMES,
    LintLimits,
    discover_problem_files,
    lint_paths,
    lint_problem,
)
from kerneljudge.lint.cli import lint_command
from kerneljudge.problem import bundled_problem_names


def _explain(report) -> str:
    return "\n".join(f"{c.name}: {c.detail}" for c in report.failures)


@pytest.mark.parametrize("name", bundled_problem_names())
def test_bundled_problem_lints_clean(name: str) -> None:
    report = lint_problem(name, device="cpu")
    if not report.passed:
        pytest.fail(f"{name} at {report.shape_set}:\n{_explain(report)}", pytrace=False)
    assert [c.name for c in report.checks] == list(CHECK_NAMES)


def test_suite_is_large_enough() -> None:
    assert len(bundled_problem_names()) >= 25


# A small, sound problem; each degenerate variant below replaces one piece of it.
_TEMPLATE = """
import torch
import torch.nn as nn

NAME = "{name}"
n = 32
SHAPE_SETS = {{"public": {{"n": 32}}, "big": {{"n": 48}}, "small": {{"n": 16}}}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n) + 2.0)
        {init}

    def forward(self, x, y):
        {body}


def get_inputs():
    return [torch.randn(n, n), torch.randn(n, n)]


def get_init_inputs():
    return []
"""
_GOOD_BODY = "return torch.tanh(x * self.w) @ y"


def _write(folder: Path, name: str, body: str = _GOOD_BODY, init: str = "") -> Path:
    path = folder / f"{name}.py"
    path.write_text(_TEMPLATE.format(name=name, body=body, init=init or "pass"))
    return path


def test_sound_external_problem_passes_with_metadata_warning(tmp_path: Path) -> None:
    report = lint_problem(_write(tmp_path, "good"))
    assert report.passed, _explain(report)
    assert report.shape_set == "small"  # no "tiny": the smallest set
    meta = report.check("metadata")
    assert meta is not None and not meta.passed and not meta.required  # a warning only


@pytest.mark.parametrize(
    ("body", "init", "check", "needle"),
    [
        ("return torch.zeros_like(x) * x * y * self.w", "", "nulls_fail", "zeros passes"),
        ("return (torch.tanh(x * self.w) @ y) * 1e-6", "", "magnitude", "below"),
        ("return self.w.expand(n, n) * 3.0", "", "inputs_matter", "same output"),
        ("return torch.tanh(x * self.w) * 3.0", "", "inputs_matter", "ignores y"),
        ("return torch.tanh(x * self.w) @ y + torch.rand(n, n)", "", "deterministic", "differ"),
        (
            "return torch.tanh(x * self.w) @ y",
            "self.unused = nn.Parameter(torch.randn(n))",
            "weights_matter",
            "unused",
        ),
        ("return x.mul_(self.w) @ y", "", "inputs_unchanged", "writes into"),
        # A scalar (a loss): its mean is the reference itself, no alarm.
        ("return (torch.tanh(x * self.w) @ y).sum()", "", "nulls_fail", None),
        ("return torch.tanh(x * self.w) @ y / 0.0", "", "finite", "NaN or inf"),
        ("return x @ y * self.w + x", "", "nulls_fail", None),  # passes: a control case
    ],
)
def test_degenerate_problem_fails_the_right_check(
    tmp_path: Path, body: str, init: str, check: str, needle: str | None
) -> None:
    report = lint_problem(_write(tmp_path, "degenerate", body, init))
    result = report.check(check)
    assert result is not None, f"{check} did not run: {_explain(report)}"
    if needle is None:
        assert result.passed, result.detail
    else:
        assert not result.passed and needle in result.detail, result.detail
        assert not report.passed


def test_first_input_passed_through_is_caught(tmp_path: Path) -> None:
    # The output equals the first input up to a tiny term: passing x through would pass.
    report = lint_problem(_write(tmp_path, "identity", "return x + 1e-7 * (y * self.w)"))
    nulls = report.check("nulls_fail")
    assert nulls is not None and "first_input passes" in nulls.detail


def test_a_reference_that_loops_over_many_steps_is_flagged_launch_bound(tmp_path: Path) -> None:
    # A Python loop of 1,500 steps, two operators each, and a matmul: a warning, not a failure.
    loop = "for _ in range(1500):\n            h = torch.tanh(h * self.w)"
    body = f"h = x\n        {loop}\n        return h @ y"
    report = lint_problem(_write(tmp_path, "loop", body))
    check = report.check("not_launch_bound")
    assert check is not None and not check.passed and not check.required, check
    assert "3001 operators" in check.detail, check.detail
    assert report.passed, _explain(report)
    sound = lint_problem(_write(tmp_path, "plain")).check("not_launch_bound")
    assert sound is not None and sound.passed and "3 operators per call" in sound.detail, sound


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def broken(:\n", "syntax error"),
        ("import torch\nclass Model: pass\ndef get_init_inputs(): return []\n", "get_inputs"),
        (_TEMPLATE.format(name="x", body="raise ValueError('boom')", init="pass"), "boom"),
        (
            _TEMPLATE.format(name="x", body=_GOOD_BODY, init="pass").replace(
                "return [torch.randn(n, n), torch.randn(n, n)]", "return [undefined]"
            ),
            "undefined",
        ),
    ],
)
def test_broken_problem_is_a_failed_report(tmp_path: Path, source: str, needle: str) -> None:
    path = tmp_path / "broken.py"
    path.write_text(source)
    report = lint_problem(path)
    assert not report.passed
    assert report.checks[0].name == "load" and not report.checks[0].passed
    assert needle in report.checks[0].detail


def test_unknown_name_and_unknown_shape_set_fail_to_load(tmp_path: Path) -> None:
    missing = lint_problem("no_such_problem")
    assert not missing.passed and missing.checks[0].name == "load"
    report = lint_problem(_write(tmp_path, "good"), shape_set="tiny")
    assert not report.passed and "no shape set 'tiny'" in report.checks[0].detail


def test_limits_are_enforced(tmp_path: Path) -> None:
    report = lint_problem(_write(tmp_path, "good"), limits=LintLimits(time_s=0.0))
    fits = report.check("fits")
    assert fits is not None and not fits.passed and not report.passed
    report = lint_problem(_write(tmp_path, "good"), limits=LintLimits(memory_bytes=100))
    assert not report.check("fits").passed


def test_checks_that_need_more_memory_than_the_host_has_fail_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem whose checks would take more than the host has fails ``fits`` and the lint
    goes on, instead of the host's out-of-memory killer ending the lint (a KernelBench conv
    of 1 GiB in, 2 GiB out took 21 GiB): here the host has 256 MiB, the second call 512."""
    import resource

    monkeypatch.setattr("kerneljudge.lint.running.available_bytes", lambda: 256 << 20)
    body = (
        "self.calls += 1\n"
        "        if self.calls == 2:\n"
        "            torch.empty(512 << 20, dtype=torch.uint8)\n"
        f"        {_GOOD_BODY}"
    )
    before = resource.getrlimit(resource.RLIMIT_DATA)
    report = lint_problem(_write(tmp_path, "hungry", body=body, init="self.calls = 0"))
    fits = report.check("fits")
    assert fits is not None and not fits.passed, _explain(report)
    assert "need more memory than the 192.0 MiB it may take" in fits.detail
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert lint_problem(_write(tmp_path, "good")).passed  # the cap is per problem


def test_folder_gives_one_report_per_problem(tmp_path: Path) -> None:
    _write(tmp_path, "alpha")
    _write(tmp_path, "beta", "return torch.zeros_like(x) * y")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", "gamma")
    (tmp_path / "helpers.py").write_text("def helper():\n    return 1\n")
    (tmp_path / "_private.py").write_text(_TEMPLATE.format(name="p", body=_GOOD_BODY, init=""))
    found = discover_problem_files(tmp_path)
    assert [p.stem for p in found] == ["alpha", "beta", "gamma"]
    reports = lint_paths([str(tmp_path)])
    assert {r.problem: r.passed for r in reports} == {"alpha": True, "beta": False, "gamma": True}


def test_lint_command_table_and_exit_code(tmp_path: Path) -> None:
    good, bad = _write(tmp_path, "good"), _write(tmp_path, "bad", "return 0 * x * y")
    buf = io.StringIO()
    assert lint_command([str(good)], None, "cpu", False, Console(file=buf, width=120)) == 0
    buf = io.StringIO()
    code = lint_command([str(good), str(bad)], None, "cpu", False, Console(file=buf, width=120))
    text = buf.getvalue()
    assert code == 1
    assert "bad" in text and "nulls_fail" in text and "1/2 problems pass" in text


def test_lint_command_json(tmp_path: Path) -> None:
    buf = io.StringIO()
    code = lint_command(
        [str(_write(tmp_path, "good"))], None, "cpu", True, Console(file=buf, width=200)
    )
    data = json.loads(buf.getvalue())
    assert code == 0 and data[0]["problem"] == "good" and data[0]["passed"] is True
    assert [c["name"] for c in data[0]["checks"]] == list(CHECK_NAMES)


def test_problem_source_is_tidy() -> None:
    """Bundled problems keep lines within 100 characters and declare what the suite needs."""
    from kerneljudge.problem import Problem

    for name in bundled_problem_names():
        problem = Problem.load(name)
        long = [i + 1 for i, line in enumerate(problem.source.splitlines()) if len(line) > 100]
        assert not long, f"{name}: lines {long} are over 100 characters"
        assert problem.description and "public" in problem.shape_sets, name


def test_typer_app_mounts_as_problems_lint(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from kerneljudge.lint import cli as lint_cli

    root = typer.Typer()
    root.add_typer(lint_cli.app, name="problems")

    @root.callback()
    def main() -> None:
        """Root."""

    good, bad = _write(tmp_path, "good"), _write(tmp_path, "bad", "return 0 * x * y")
    runner = CliRunner()
    assert runner.invoke(root, ["problems", "lint", str(good)]).exit_code == 0
    result = runner.invoke(root, ["problems", "lint", str(good), str(bad), "--json"])
    assert result.exit_code == 1
    assert [r["passed"] for r in json.loads(result.stdout)] == [True, False]


# Masks (0/1 floats) and indices beside a continuous input: the inputs the judge's input
# classifier tells apart, and a float64 oracle and operators to record.
_MASKED_GATHER = """
import torch
import torch.nn as nn

NAME = "masked_gather"
n, k = 48, 12
SHAPE_SETS = {"public": {"n": 48, "k": 12}, "small": {"n": 24, "k": 6}}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n) + 2.0)

    def forward(self, x, mask, idx):
        y = torch.tanh(x * self.w) * mask
        return torch.softmax(y.index_select(1, idx) * 4.0, dim=-1)


def get_inputs():
    mask = (torch.rand(n, n) > 0.3).float()
    return [torch.randn(n, n), mask, torch.randint(0, n, (k,))]


def get_init_inputs():
    return []
"""


def test_lint_and_worker_share_one_oracle_recorder_and_classifier() -> None:
    """The lint imports the judge's own float64 oracle, operator recorder and input classifier
    (one module, the same function objects), not copies of them."""
    import kerneljudge.lint as lint
    from kerneljudge.lint import checks, report, running
    from kerneljudge.worker import forward, measure, runtime

    assert lint.float64_oracle is forward.float64_oracle is runtime.float64_oracle
    assert running.OpRecorder is forward.OpRecorder is runtime.OpRecorder
    assert forward.continuous is measure.continuous
    assert runtime.nudgeable is forward.nudgeable
    # Nothing left in the lint that computes them on its own.
    lint_sources = "".join(
        Path(str(m.__file__)).read_text() for m in (lint, checks, report, running)
    )
    for name in ("TorchDispatchMode", "deepcopy", "model64", "def continuous"):
        assert name not in lint_sources, name


def test_lint_and_worker_agree_on_a_problem_with_masks_and_indices(tmp_path: Path) -> None:
    """On one problem with a mask and an index input, a real reference worker and the lint's
    code give the same float64 oracle (bit for bit), record the same operators, and classify
    the inputs alike (the worker's perturbed call equals one on inputs perturbed here)."""
    from kerneljudge.lint.running import _operator_count
    from kerneljudge.problem import Problem
    from kerneljudge.worker import WorkerProcess, forward, measure

    path = tmp_path / "masked_gather.py"
    path.write_text(_MASKED_GATHER)
    problem = Problem.load(path)
    problem.use_shape_set("public")
    inputs = problem.make_inputs(7)
    changed = [p is not None for p in forward.nudgeable(inputs)]
    assert changed == [True, False, False]  # x, mask, idx
    model = problem.make_model(3)
    oracle = forward.float64_oracle(model, inputs, torch.device("cpu"))
    args = [x.clone() for x in inputs]
    with torch.no_grad(), forward.OpRecorder() as recorder:
        model(*args)
    assert oracle.dtype == torch.float64 and {"index_select", "_softmax"} <= recorder.ops

    worker = WorkerProcess("reference", "cpu", record_ops=True)
    try:
        worker.request("load_problem", 120, path=str(path), shape_set="public")
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        worker.request("setup", 120, init_inputs=[], state_dict=state)
        reply = worker.request("run", 120, inputs=inputs, oracle=True, record_ops=True)
        assert torch.equal(reply["oracle"], oracle)
        assert reply["ops"] == sorted(recorder.ops)
        assert _operator_count(model, inputs) == recorder.count
        worker.request("run", 120, inputs=inputs, expect="k", hold_inputs=True)
        timed = worker.request("run", 120, from_held="k", perturb=11, keep=False)
    finally:
        worker.close()
    here = measure.perturb(inputs, forward.nudgeable(inputs), 11)
    assert torch.equal(here[1], inputs[1]) and torch.equal(here[2], inputs[2])
    assert not torch.equal(here[0], inputs[0])
    with torch.no_grad():
        assert torch.equal(timed["outputs"], model(*here))
