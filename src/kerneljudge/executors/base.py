"""The executor interface: "judge this (problem, candidate, options) and give me the verdict".

A :class:`Job` is plain data (it crosses processes, HTTP and Ray as a JSON-ready dict); an
:class:`Executor` turns jobs into verdicts somewhere (this machine's devices, a Ray cluster)
and answers with a :class:`concurrent.futures.Future` per job. Faults of the candidate are
statuses in its verdict, as with :class:`~kerneljudge.judge.Judge`; a failure of the harness
for one job (a problem that cannot be loaded, no device for a CUDA candidate, a job that
cannot be judged at all) is the job's :class:`JobError`, raised by its future's ``result()``.
"""

from __future__ import annotations

import hashlib
import secrets
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from kerneljudge.errors import CandidateError, DeviceError, KernelJudgeError, ProblemError
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.verdict import Verdict

__all__ = ["Executor", "ExecutorStats", "Job", "JobError", "error_kind", "new_job_id"]


def new_job_id() -> str:
    """A fresh random job id (24 hex digits)."""
    return secrets.token_hex(12)


class JobError(KernelJudgeError):
    """A job that got no verdict: the harness failed for it (the message says why, one line).

    Attributes:
        kind: ``problem`` (the problem cannot be loaded or its reference fails on its own),
            ``device`` (no device of the kind the candidate needs), ``candidate`` (the
            candidate cannot be read), ``cancelled``, ``harness`` (anything else).
    """

    def __init__(self, message: str, kind: str = "harness") -> None:
        super().__init__(message)
        self.kind = kind


def error_kind(exc: BaseException) -> str:
    """The :class:`JobError` kind of a harness failure a judge raised: ``problem``
    (:class:`~kerneljudge.errors.ProblemError`), ``device``, ``candidate``, else ``harness``."""
    if isinstance(exc, ProblemError):
        return "problem"
    if isinstance(exc, DeviceError):
        return "device"
    if isinstance(exc, CandidateError):
        return "candidate"
    return "harness"


@dataclass(frozen=True)
class Job:
    """One verdict to compute.

    Attributes:
        problem: a bundled problem name or a problem file's path (on the machine that judges).
        source: the candidate's source text (a ``ModelNew`` module).
        options: how to judge (:class:`~kerneljudge.judge.options.JudgeOptions`; its
            ``device`` may name ``cuda:N`` to pin the job to that GPU).
        job_id: the caller's id for this job, unique per job (idempotency key: an executor
            or a service that sees the same id twice judges it once).
        name: the candidate's file name in build logs and tracebacks.
    """

    problem: str
    source: str
    options: JudgeOptions = field(default_factory=JudgeOptions)
    job_id: str = field(default_factory=new_job_id)
    name: str = "candidate.py"

    @property
    def source_sha256(self) -> str:
        """SHA-256 of the candidate's source (UTF-8), hex."""
        return hashlib.sha256(self.source.encode("utf-8", "surrogatepass")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (:meth:`from_dict` reads it back)."""
        d = asdict(self)
        d["options"] = self.options.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """Read :meth:`to_dict`'s form.

        Raises:
            ValueError: a field is missing or of the wrong type, or an option is out of its
                range (the message says which, one line).
        """
        if not isinstance(data, dict):
            raise ValueError("a job is a JSON object")
        for key in ("problem", "source"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"job.{key} must be a non-empty string")
        options = data.get("options") or {}
        if not isinstance(options, dict):
            raise ValueError("job.options must be an object")
        kwargs: dict[str, Any] = {
            "problem": data["problem"],
            "source": data["source"],
            "options": JudgeOptions.from_dict(options, strict=True),
        }
        for key in ("job_id", "name"):
            if data.get(key) is not None:
                if not isinstance(data[key], str) or not data[key]:
                    raise ValueError(f"job.{key} must be a non-empty string")
                kwargs[key] = data[key]
        return cls(**kwargs)


@dataclass(frozen=True)
class ExecutorStats:
    """A snapshot of an executor's load.

    Attributes:
        queued: jobs accepted and not yet started.
        running: jobs being built or judged now.
        done: verdicts given since the executor started (JobErrors not counted).
        failed: jobs that ended in a :class:`JobError`.
        busy_share: per device (``cpu:N`` slot or ``cuda:N``), the share of wall time since
            the executor started that the device spent judging, in [0, 1].
        uptime_s: seconds since the executor started.
    """

    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    busy_share: dict[str, float] = field(default_factory=dict)
    uptime_s: float = 0.0

    @property
    def verdicts_per_s(self) -> float:
        return self.done / self.uptime_s if self.uptime_s > 0 else 0.0


class Executor(ABC):
    """Where verdicts are computed. Thread-safe: any thread may submit.

    Use as a context manager, or call :meth:`close`. A job submitted twice with the same
    ``job_id`` while the first is pending gets the first one's future.
    """

    @abstractmethod
    def submit(self, job: Job) -> Future[Verdict]:
        """Accept ``job``; its future gives the :class:`Verdict` or raises :class:`JobError`.

        Raises:
            RuntimeError: the executor is closed.
        """

    def judge(self, job: Job, timeout: float | None = None) -> Verdict:
        """:meth:`submit` and wait (``timeout`` seconds, None: no limit).

        Raises:
            JobError: the job got no verdict.
            TimeoutError: no answer within ``timeout``.
        """
        return self.submit(job).result(timeout)

    def cancel(self, job_id: str) -> bool:
        """Cancel a job not yet started; True when it was cancelled (its future then raises
        :class:`JobError` of kind ``cancelled``)."""
        return False

    @abstractmethod
    def stats(self) -> ExecutorStats:
        """The executor's load now."""

    @abstractmethod
    def close(self) -> None:
        """Stop accepting jobs, end every worker process (pending jobs' futures raise
        :class:`JobError` of kind ``cancelled``). Idempotent."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
