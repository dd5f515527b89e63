"""How a request to a worker can fail, as the supervisor sees it.

:class:`CandidateFault`: the candidate's code raised or broke a rule (the worker lives on);
:class:`WorkerDied` (and its kinds :class:`WorkerOverMemory`, :class:`WorkerReplyTooLarge`): the
worker is gone; :class:`WorkerTimeout`: no answer in time, the worker has been killed. The judge
turns each into a verdict (:mod:`kerneljudge.judge.outcome`).
"""

from __future__ import annotations

import signal

from kerneljudge.worker.sandbox import LOG_LIMIT_BYTES

__all__ = [
    "CandidateFault",
    "WorkerDied",
    "WorkerOverMemory",
    "WorkerReplyTooLarge",
    "WorkerTimeout",
]


class CandidateFault(Exception):
    """The code under test raised (reported by a live worker).

    Attributes:
        lineno: the candidate line it came from, when the worker could tell.
        status: ``runtime_error``, or ``rejected`` for a policy violation the worker caught.
    """

    def __init__(self, message: str, lineno: int | None = None, status: str = "runtime_error"):
        super().__init__(message)
        self.lineno = lineno
        self.status = status if status in ("runtime_error", "rejected") else "runtime_error"


class WorkerDied(Exception):
    """The worker process ended without answering.

    Attributes:
        returncode: the exit status (negative: killed by that signal).
        log_tail: the end of its stdout/stderr.
    """

    def __init__(self, returncode: int | None, log_tail: str) -> None:
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(self.describe())

    def describe(self) -> str:
        code = self.returncode
        if code is None:
            return "the worker closed its channel"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if name == "SIGXFSZ":
                return f"the candidate wrote more than {LOG_LIMIT_BYTES >> 20} MiB of output"
            return f"the worker was killed by {name}"
        return f"the worker exited with status {code}"


class WorkerOverMemory(WorkerDied):
    """The worker (with its children) used more host memory than allowed and was killed."""

    def __init__(self, limit_bytes: int, log_tail: str) -> None:
        self.limit_bytes = limit_bytes
        super().__init__(-signal.SIGKILL, log_tail)

    def describe(self) -> str:
        return f"the candidate used more than {self.limit_bytes / 2**30:.1f} GiB of host memory"


class WorkerReplyTooLarge(WorkerDied):
    """The worker sent a reply longer than the supervisor accepts from it (its
    ``reply_limit_bytes``); it was killed before any of the reply was read."""

    def __init__(self, length: int, limit: int, log_tail: str) -> None:
        self.length, self.limit = length, limit
        super().__init__(-signal.SIGKILL, log_tail)

    def describe(self) -> str:
        return (
            f"the candidate's reply of {self.length / 2**20:.0f} MiB exceeds the "
            f"{self.limit / 2**20:.0f} MiB the judge relays"
        )


class WorkerTimeout(Exception):
    """A request got no answer in time; the worker has been killed."""

    def __init__(self, op: str, timeout_s: float) -> None:
        self.op = op
        self.timeout_s = timeout_s
        super().__init__(f"{op} did not finish within {timeout_s:g} s")
