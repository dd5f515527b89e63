"""The judge: build -> check -> timing -> verdict, for one problem and any number of candidates.

Process model: this (supervisor) process never imports candidate code. Builds run in a build
worker with no GPU visible; each candidate runs in a fresh candidate worker (taken from a pool
started ahead of need) that is discarded afterwards; the reference runs and is timed in a
separate, trusted reference worker on the same device. Inputs are drawn from a secret per-run
seed; each trial's inputs, reference outputs and float64 oracle stay in the reference worker
(its outputs and oracle on its GPU while they fit), which also compares the candidate's outputs
with them on its device (:func:`kerneljudge.check.compare_outputs`). This process only relays
one trial's inputs or outputs at a time, and checks before the trials that it can
(:mod:`kerneljudge.check.memory`).

Modules: :mod:`~kerneljudge.judge.config` (:class:`JudgeConfig`, the defaults and the checks
of its fields), :mod:`~kerneljudge.judge.reference_side` (the reference's workers and its part
of a verdict, prepared on a thread while the candidate builds),
:mod:`~kerneljudge.judge.pipeline` (:class:`Judge`: the stages of one verdict),
:mod:`~kerneljudge.judge.loading` (the candidate's import in its worker),
:mod:`~kerneljudge.judge.outcome` (the stage clock and how failures become verdicts) and
:mod:`~kerneljudge.judge.profiling` (:meth:`Judge.profile`). The trial
loop is :mod:`kerneljudge.check.trials`, the timing stage :mod:`kerneljudge.timing.stage`.
"""

from pathlib import Path

from kerneljudge.candidate import Candidate
from kerneljudge.judge.config import JudgeConfig
from kerneljudge.judge.pipeline import Judge
from kerneljudge.judge.reference_side import Preparation, ReferenceSide
from kerneljudge.problem import Problem
from kerneljudge.verdict import Verdict

__all__ = ["Judge", "JudgeConfig", "Preparation", "ReferenceSide", "judge"]


def judge(
    problem: Problem | str | Path,
    candidate: Candidate | str | Path,
    config: JudgeConfig | None = None,
) -> Verdict:
    """Judge one candidate on one problem (starts and ends its own workers).

    Raises:
        ProblemError, CandidateError, DeviceError, WorkerError: see :meth:`Judge.evaluate`.
    """
    with Judge(problem, config) as j:
        return j.evaluate(candidate)
