"""How a verdict is written: the stage clock, the early decisions of stages, and the mapping of
the candidate's failures (faults, deaths, timeouts, a reference it broke) to statuses.
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from datetime import UTC, datetime
from typing import Any

import torch

from kerneljudge.check.reference import ReferenceFailed, ReferenceSession
from kerneljudge.check.trials import TrialRejected
from kerneljudge.errors import first_line
from kerneljudge.judge.reference_side import Prepared, problem_failed
from kerneljudge.verdict import BuildResult, CheckResult, Status, TrialResult, Verdict
from kerneljudge.worker import CandidateFault, WorkerDied, WorkerProcess, WorkerTimeout

__all__ = [
    "CANDIDATE_FAILURES",
    "Decided",
    "Reductions",
    "Stopwatch",
    "VerdictWriter",
    "build_failure",
    "now",
    "versions",
]

#: What the candidate's run can raise that becomes a verdict (:meth:`VerdictWriter.failure`).
CANDIDATE_FAILURES = (TrialRejected, CandidateFault, WorkerDied, WorkerTimeout, ReferenceFailed)


class Decided(Exception):
    """A stage decided the verdict before the end: its status, reason and verdict fields."""

    def __init__(self, status: Status, reason: str, **fields: Any) -> None:
        super().__init__(reason)
        self.status, self.reason, self.fields = status, reason, fields


class Stopwatch:
    """Seconds per stage of one verdict, each stage from the end of the one before it.

    Attributes:
        started_at: the wall-clock start (ISO 8601, UTC, seconds).
        stages: stage name -> its seconds (monotonic clock), in the order they ended.
    """

    def __init__(self) -> None:
        self.started_at = now()
        self._t0 = self._last = time.monotonic()
        self.stages: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """End the stage ``name`` now."""
        t = time.monotonic()
        self.stages[name] = t - self._last
        self._last = t

    def elapsed(self) -> float:
        """Seconds since the start."""
        return time.monotonic() - self._t0


class Reductions:
    """What the judge reduced for want of memory in one verdict (:attr:`Verdict.reductions`),
    read when the verdict is written, so that one ended early says what it had reduced so far.

    Attributes:
        prepared: the verdict's trials (None before the reference stage), as the trials
            stage leaves them: one whose reply says ``oracle_on_host`` counts as an oracle made
            on the host.
        deferred: how many of them were deferred when the reference stage gave them
            (:attr:`~kerneljudge.check.reference.HeldTrial.deferred`).
        audits: the reference session whose audits of timed calls the verdict made, and its
            :attr:`~kerneljudge.check.reference.ReferenceSession.host_oracles` before them.
    """

    def __init__(self) -> None:
        self.prepared: Prepared | None = None
        self.deferred = 0
        self.audits: tuple[ReferenceSession, int] | None = None

    def trials(self, prepared: Prepared) -> None:
        """Take the reference stage's trials (before any deferred one ran)."""
        self.prepared = prepared
        self.deferred = sum(h.deferred for runs in prepared.values() for h in runs)

    def lines(self) -> tuple[str, ...]:
        """One line per reduction made (none: empty)."""
        held = [h for runs in (self.prepared or {}).values() for h in runs]
        on_host = sum(bool(h.reply.get("oracle_on_host")) for h in held)
        audits = self.audits[0].host_oracles - self.audits[1] if self.audits else 0
        out = []
        if self.deferred:
            out.append(
                f"{self.deferred} of {len(held)} trials were deferred: the reference runs them "
                f"only when the candidate's are compared (no room to keep them ahead)"
            )
        if on_host:
            out.append(
                f"the float64 oracle of {on_host} of {len(held)} trials was computed on the "
                f"host (the device ran out of memory for it)"
            )
        if audits:
            out.append(
                f"the float64 oracle of {audits} audited timed call(s) was computed on the host "
                f"(the device ran out of memory for it)"
            )
        return tuple(out)


class VerdictWriter:
    """Writes the verdict of one candidate: the fields known at the start (``base``), its
    stage durations, what the stages found (:meth:`write`, :meth:`failure`), and what was
    reduced for want of memory (``reductions``, set by the stages that know it)."""

    def __init__(self, clock: Stopwatch, **base: Any) -> None:
        self.clock, self.base = clock, base
        self.reductions = Reductions()

    def write(self, status: Status, reason: str, **fields: Any) -> Verdict:
        return Verdict(
            status=status,
            reason=reason,
            finished_at=now(),
            duration_s=self.clock.elapsed(),
            stage_s=dict(self.clock.stages),
            reductions=self.reductions.lines(),
            **self.base,
            **fields,
        )

    def decided(self, d: Decided) -> Verdict:
        return self.write(d.status, d.reason, **d.fields)

    def failure(
        self,
        exc: BaseException,
        build: BuildResult,
        worker: WorkerProcess,
        trials: list[TrialResult],
        rule: tuple[str, float, float],
    ) -> Verdict:
        """The verdict of a candidate whose run raised ``exc`` (one of
        :data:`CANDIDATE_FAILURES`); ``trials``: those done before it; ``rule``: the
        tolerance rule and its ``(atol, rtol)`` they were checked with.

        Raises:
            ProblemError: the reference failed before it ever worked (the problem's error).
        """
        if isinstance(exc, TrialRejected):
            return self.write(Status.REJECTED, str(exc), build=build)
        if isinstance(exc, CandidateFault):
            so_far = CheckResult(False, tuple(trials), *rule)
            return self.write(
                Status.REJECTED if exc.status == "rejected" else Status.RUNTIME_ERROR,
                first_line(str(exc)),
                build=build,
                check=so_far if trials else None,
                worker_log=str(exc) + "\n" + worker.log_tail(),
            )
        if isinstance(exc, WorkerDied):
            return self.write(
                Status.RUNTIME_ERROR, exc.describe(), build=build, worker_log=exc.log_tail
            )
        if isinstance(exc, WorkerTimeout):
            return self.write(
                Status.TIMEOUT,
                f"the candidate's {exc.op} did not finish within {exc.timeout_s:g} s",
                build=build,
                worker_log=worker.log_tail(),
            )
        assert isinstance(exc, ReferenceFailed)
        if not exc.had_answered:  # it never worked: the problem's error, not the candidate's
            raise problem_failed(exc) from None
        # The candidate ran beside it: it may have killed or stopped the reference. The
        # reference is replaced for the next evaluation either way.
        return self.write(
            Status.RUNTIME_ERROR,
            f"the reference worker failed while this candidate was judged: {exc}",
            build=build,
            worker_log=worker.log_tail(),
        )


def build_failure(result: BuildResult) -> Decided:
    """The verdict of a build that failed: timeout, rejected (a policy), or compile error,
    with the first error message at its line of the candidate's file."""
    status = (
        Status.TIMEOUT
        if result.timed_out
        else Status.REJECTED
        if result.rejected
        else Status.COMPILE_ERROR
    )
    first = next((m for m in result.messages if m.severity == "error"), None)
    where = f"line {first.candidate_line}: " if first and first.candidate_line else ""
    return Decided(status, where + (first.message if first else "build failed"), build=result)


def now() -> str:
    """The wall-clock time, ISO 8601, UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    """kerneljudge's, Python's, torch's, CUDA's (and Triton's, when installed) versions."""
    from kerneljudge import __version__

    out = {
        "kerneljudge": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
    try:
        out["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    return out
