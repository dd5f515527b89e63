"""Warm judges on one device, one job at a time: the judging core shared by the local
executor's slot process (:mod:`kerneljudge.executors.slot`) and the Ray executor's judging
actor (:class:`kerneljudge.executors._ray_host.JudgeHost`).

:class:`WarmJudges` keeps one :class:`~kerneljudge.judge.Judge` per (problem, build cache
folder), at most ``max_judges`` of them, the least recently used closed first. All of them
share one device lock, held while a job is judged, so no judge's work ahead of need (its
next verdict's reference side) runs beside another's timing. A judge that fails for a reason
other than the candidate or the device (a harness failure: its reference worker died, the
problem's reference fails on its own, a bug) is closed and dropped, so the next job on that
problem starts a fresh one. A new judge takes its probe and its workers from the host's
:class:`~kerneljudge.worker.spares.Spares`, refilled once a job is answered
(:meth:`WarmJudges.refill`), so that a job on a problem the host has not judged yet does not
wait for interpreters to start.

:meth:`WarmJudges.run` never raises for a job (only ``KeyboardInterrupt`` and the like pass
through): it answers an :class:`Outcome`, a verdict or a :class:`~kerneljudge.executors.JobError`
kind and one-line message, which each caller writes in its own wire format.

Heavy modules (torch, through the judge) are imported on first use, so a slot process can
set its CPU affinity before anything starts a thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerneljudge.executors.base import Job
    from kerneljudge.judge import Judge, JudgeConfig
    from kerneljudge.verdict import BuildResult, Verdict
    from kerneljudge.worker.spares import Spares

__all__ = ["HOST_FIELDS", "Outcome", "WarmJudges", "one_line"]

#: The fields of a job's :class:`JudgeConfig` that belong to the judge rather than to one job
#: (the device, the build cache, torch threads); every other field is set per job through
#: :meth:`Judge.configured`.
HOST_FIELDS = ("device", "cache_dir", "threads")
#: The longest one-line error message, in characters.
MAX_MESSAGE = 500


def one_line(exc: BaseException, plain: bool = False) -> str:
    """``exc`` as one line of at most :data:`MAX_MESSAGE` characters: the first line of its
    message (a :class:`~kerneljudge.errors.KernelJudgeError`'s, or any with ``plain``), else
    ``"<type>: <first line>"``; the type's name when the message is empty."""
    from kerneljudge.errors import KernelJudgeError

    text = str(exc).strip().splitlines()
    first = text[0].strip() if text else ""
    if not first:
        line = type(exc).__name__
    elif plain or isinstance(exc, KernelJudgeError):
        line = first
    else:
        line = f"{type(exc).__name__}: {first}"
    return line[:MAX_MESSAGE]


@dataclass(frozen=True)
class Outcome:
    """One job's answer.

    Attributes:
        verdict: the verdict (None when the job got none).
        kind: the :class:`~kerneljudge.executors.JobError` kind when ``verdict`` is None
            (``problem``, ``device``, ``candidate``, ``harness``), else "".
        message: why there is no verdict, one line ("" with a verdict).
        busy_s: seconds :meth:`WarmJudges.run` spent on the job (monotonic clock), waiting
            for the device lock included.
    """

    verdict: Verdict | None
    kind: str = ""
    message: str = ""
    busy_s: float = 0.0


class WarmJudges:
    """Warm judges on one device, one job at a time (see the module doc). Not thread-safe:
    one caller thread judges; the judges' own threads take :attr:`device_lock`.

    Args:
        device: ``"cpu"`` or ``"cuda:N"``: the device every judge here runs on.
        max_judges: warm judges kept (at least 1).
    """

    def __init__(self, device: str, max_judges: int) -> None:
        self.device = device
        self.max_judges = max(1, max_judges)
        self._judges: OrderedDict[tuple[str, str], Judge] = OrderedDict()
        #: Processes started ahead of the next new judge (stopped from a candidate's load to the
        #: end of its verdict); made with the first judge (importing it imports torch).
        self.spares: Spares | None = None
        #: Held while a job is judged; every warm judge's work ahead of need (its next
        #: verdict's reference side) waits for it, so none runs beside another's timing.
        self.device_lock = threading.Lock()

    def arch(self) -> str:
        """The CUDA arch this device's judges build for (:func:`kerneljudge.device.build_arch`)."""
        from kerneljudge.device import build_arch

        return build_arch(self.device)

    def warm(self) -> list[str]:
        """The problems of the warm judges, least recently used first."""
        return [problem for problem, _ in self._judges]

    def run(
        self,
        job_data: dict[str, Any],
        config_of: Callable[[Job], JudgeConfig],
        built: BuildResult | None = None,
        prepare: Callable[[JudgeConfig], None] | None = None,
    ) -> Outcome:
        """Judge one job.

        Args:
            job_data: the job (:meth:`Job.to_dict`).
            config_of: the :class:`JudgeConfig` to judge the job with (its device is this
                host's); may raise ``ConfigError``.
            built: a build of the job's candidate to use instead of building (one the cache
                does not keep: a build that timed out), or None.
            prepare: called with the job's config before its judge is looked up (e.g. to
                install a cache entry built elsewhere).

        Returns:
            The :class:`Outcome`. A job that cannot be read or configured is kind
            ``harness`` (its message as it is); other failures are mapped by
            :func:`kerneljudge.executors.base.error_kind`.
        """
        from kerneljudge.candidate import Candidate
        from kerneljudge.errors import CandidateError, DeviceError
        from kerneljudge.executors.base import Job, error_kind

        t0 = time.monotonic()
        try:
            job = Job.from_dict(job_data)
            config = config_of(job)
        except Exception as exc:  # noqa: BLE001 - Job.from_dict's messages name the field
            return Outcome(None, "harness", one_line(exc, plain=True), time.monotonic() - t0)
        try:
            cand = Candidate.from_source(job.source, name=job.name)
            if prepare is not None:
                prepare(config)
            judge = self._judge_for(job.problem, config)
            per_job = {
                f.name: getattr(config, f.name)
                for f in dataclasses.fields(config)
                if f.name not in HOST_FIELDS
            }
            try:
                with (
                    self.device_lock,
                    judge.configured(**per_job),
                    _handed_build(judge, cand, built),
                ):
                    verdict = judge.evaluate(cand)
            except (DeviceError, CandidateError):
                raise
            except BaseException:  # a harness failure may leave the judge unusable: drop it
                self._drop(job.problem, config)
                raise
        except Exception as exc:  # every failure is this job's error, never the host's
            outcome = Outcome(None, error_kind(exc), one_line(exc), time.monotonic() - t0)
        else:
            outcome = Outcome(verdict, busy_s=time.monotonic() - t0)
        return outcome

    def refill(self) -> None:
        """Start the spares the last jobs took (the host calls it once it has answered a job;
        :meth:`~kerneljudge.worker.spares.Spares.refill`: a failure is logged, never raised)."""
        if self.spares is not None:
            self.spares.refill()

    def close(self) -> None:
        """Close every warm judge and every spare (their worker processes end)."""
        while self._judges:
            _, judge = self._judges.popitem()
            _close_quietly(judge)
        if self.spares is not None:
            _close_quietly(self.spares)

    def _judge_for(self, problem: str, config: JudgeConfig) -> Judge:
        """The warm judge of (problem, cache folder), made the most recently used; a new one
        (``ProblemError``: not kept) when there is none, the least recently used beyond
        :attr:`max_judges` closed."""
        from kerneljudge.judge import Judge
        from kerneljudge.worker.spares import Spares

        key = (problem, str(config.cache_dir or ""))
        judge = self._judges.get(key)
        if judge is not None:
            self._judges.move_to_end(key)
            return judge
        if self.spares is None:
            self.spares = Spares()
        judge = Judge(problem, config, spares=self.spares)
        judge.device_lock = self.device_lock
        self._judges[key] = judge
        while len(self._judges) > self.max_judges:
            _, old = self._judges.popitem(last=False)
            _close_quietly(old)
        return judge

    def _drop(self, problem: str, config: JudgeConfig) -> None:
        judge = self._judges.pop((problem, str(config.cache_dir or "")), None)
        if judge is not None:
            _close_quietly(judge)


class _handed_build:  # noqa: N801 - used as a context manager, like contextlib's helpers
    """Within the block, ``judge.build`` of ``cand`` returns ``built`` (a build the executor ran
    whose result the cache does not keep: a timed-out one) instead of building again."""

    def __init__(self, judge: Any, cand: Any, built: Any) -> None:
        self.judge, self.cand, self.built = judge, cand, built

    def __enter__(self) -> None:
        if self.built is None:
            return
        original, sha, built = type(self.judge).build, self.cand.sha256, self.built

        def build(cand: Any, device: str | None = None) -> Any:
            if cand.sha256 == sha:
                return built
            return original(self.judge, cand, device)

        self.judge.build = build

    def __exit__(self, *exc: object) -> None:
        self.judge.__dict__.pop("build", None)


def _close_quietly(judge: Any) -> None:
    try:
        judge.close()
    except Exception:  # noqa: BLE001 - closing a broken judge must not end the host
        pass
