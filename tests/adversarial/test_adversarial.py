"""The adversarial suite (run_suite.py) under pytest: one test per candidate file.

``cpu/*.py`` run on the CPU in every test run; ``gpu/*.py`` are marked ``gpu``. Each problem is
judged on one Judge for the whole module, its correct baseline first, exactly as
``run_suite.py`` does (:class:`run_suite.ProblemRun`); a test fails when the row's outcome is not
``OK`` (FOOLED, WRONG, BROKE or LEAK, with the notes that gave it away). The speedup rule of timing
cheats is applied against the baseline's speedups judged so far.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
import run_suite
from run_suite import Case, ProblemRun, Suite

from kerneljudge.candidate import Candidate

HERE = Path(__file__).resolve().parent


def _grouped(cases: list[Case]) -> list[Case]:
    """By problem, each problem's baseline first: one problem's judge is alive at a time (as in
    run_suite.py; the left-over-process check counts only live judges' workers as the judge's)."""
    return sorted(cases, key=lambda c: (c.problem, not c.is_baseline, c.name))


CPU = _grouped(run_suite.load_cases([HERE / "cpu"]))
GPU = _grouped(run_suite.load_cases([HERE / "gpu"]))


def _compiled(case: Case) -> bool:
    """Whether the case's candidate is built by a compiler (``cpp`` or ``cuda`` backend)."""
    return Candidate.from_file(case.path).backend in ("cpp", "cuda")


#: Problems whose correct baseline is compiled: judging any of their cases builds it first.
_COMPILED_BASELINES = {c.problem for c in CPU + GPU if c.is_baseline and _compiled(c)}


def _params(cases: list[Case]) -> list[object]:
    """``cases`` as parameters, marked ``slow`` where judging them runs a real compiler build
    (when the shared build cache does not hold it yet)."""
    return [
        pytest.param(
            c,
            id=c.name,
            marks=[pytest.mark.slow] if _compiled(c) or c.problem in _COMPILED_BASELINES else [],
        )
        for c in cases
    ]


class _Runs:
    """One :class:`ProblemRun` per (problem, device), started on first use."""

    def __init__(self, suite: Suite, baselines: list[Case]) -> None:
        self.suite, self.baselines = suite, baselines
        self.runs: dict[tuple[str, str], ProblemRun] = {}

    def get(self, case: Case) -> ProblemRun:
        device = "cuda" if case.path.parent.name == "gpu" else "cpu"
        key = (case.problem, device)
        if key not in self.runs:
            self.close()
            baseline = next((b for b in self.baselines if b.problem == case.problem), None)
            spec = run_suite.problem_spec(case)
            self.runs[key] = ProblemRun(self.suite, spec, device, baseline, self.baselines)
        return self.runs[key]

    def close(self) -> None:
        for run in self.runs.values():
            run.close()
        self.runs.clear()


def _suite_args() -> argparse.Namespace:
    return run_suite.build_parser().parse_args([])


@pytest.fixture(scope="module")
def runs(shared_cache: Path) -> Iterator[_Runs]:
    with run_suite.suite_environment() as adv_dir:
        suite = Suite(_suite_args(), adv_dir, shared_cache)
        holder = _Runs(suite, [c for c in CPU + GPU if c.is_baseline])
        try:
            yield holder
        finally:
            holder.close()


def _check(runs: _Runs, case: Case) -> None:
    run = runs.get(case)
    if case.is_baseline:
        row = run.baseline_row
        assert row is not None
    else:
        row = run.judge(case)
        run_suite.apply_speedup_rule(
            row,
            runs.suite.baseline_speedups.get(case.problem, []),
            runs.suite.baseline_speedups.get(run_suite.graph_key(case.problem), []),
        )
    Suite.print_row(row)
    assert row.outcome == "OK", f"{row.outcome}: got {row.got}: {run_suite.why(row)}"


@pytest.mark.parametrize("case", _params(CPU))
def test_cpu_candidate(runs: _Runs, case: Case) -> None:
    _check(runs, case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _params(GPU))
def test_gpu_candidate(runs: _Runs, case: Case) -> None:
    _check(runs, case)
