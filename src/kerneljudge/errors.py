"""Harness errors: what is wrong with the judge's inputs or set-up (never with a candidate).

A candidate's own failures (compile errors, wrong output, crashes, timeouts) are data in a
:class:`~kerneljudge.verdict.Verdict`; these exceptions are for everything else and each carries a
one-line message fit for a terminal.
"""

from __future__ import annotations

__all__ = ["KernelJudgeError", "ProblemError", "CandidateError", "DeviceError", "WorkerError"]


class KernelJudgeError(Exception):
    """Base class of every error kerneljudge raises on purpose."""


class ProblemError(KernelJudgeError):
    """A problem file or name is unusable (missing, unknown, does not import, lacks ``Model``)."""


class CandidateError(KernelJudgeError):
    """A candidate file cannot be read at all (missing file, not text).

    Everything that is wrong *inside* a readable candidate is a verdict instead.
    """


class DeviceError(KernelJudgeError):
    """The requested device is not there (e.g. a ``cuda`` candidate on a machine without a GPU)."""


class WorkerError(KernelJudgeError):
    """A trusted worker (the reference process) failed: a harness bug, never a candidate's fault."""
