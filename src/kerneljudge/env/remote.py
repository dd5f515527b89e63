"""A judge behind the judge service (``kerneljudge serve``): the environment's tools get their
verdicts from a service on another machine, so a trainer without a GPU drives episodes while the
GPU box judges.

:class:`RemoteJudge` is what an environment is handed (``KernelEnv(..., judge=RemoteJudge(...))``,
or ``KernelEnv(..., server=URL, token=T)``); :class:`RemoteSession` is the environment's judge
session over it, with :class:`~kerneljudge.env._context.JudgeSession`'s methods. Each tool call
is one job (:class:`~kerneljudge.executors.base.Job`) with the options the local tool uses:

- ``compile_kernel``: the service has no build-only job; one correctness trial on the public
  shapes without timing is judged and its verdict's build result is the observation's.
- ``run_correctness``: ``trials`` trials on the public shapes, no timing.
- ``run_benchmark``: one trial, then timing against ``baselines`` for ``benchmark_time_s``.
- ``submit_kernel``: ``submit_trials`` trials of every shape set, timing for ``submit_time_s``,
  the service's fresh secret seeds.

What a job cannot carry stays local or is not used: ``cache_dir`` (the service's own build cache)
and ``threads``. ``run_benchmark``'s profile is not available through the service (the
observation says so). The service judges one timing per device at a time, so a remote session
holds no device lock while it waits.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kerneljudge.candidate import Candidate
from kerneljudge.env.config import EnvConfig
from kerneljudge.errors import DeviceError, KernelJudgeError, ProblemError
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.problem import Problem
from kerneljudge.verdict import BuildResult, DeviceInfo, Verdict

__all__ = ["PROFILE_NOTE", "RemoteJudge", "RemoteSession"]

#: The note of ``run_benchmark``'s profile through the service.
PROFILE_NOTE = "the profiler is not available through the judge service"
#: A source that stops at its static check: judged at once, its verdict names the device.
_PROBE_SOURCE = "# kerneljudge device probe\nclass ModelNew(\n"
#: Seconds a request may keep failing to reach the service before the tool call fails.
UNREACHABLE_RETRY_S = 60.0


class RemoteJudge:
    """A judge that is a client of the judge service at ``server``.

    Args:
        problem: the problem (a :class:`Problem`, a bundled name or a file), loaded here for the
            task prompt.
        server: the service's address (``http://host:port``).
        token: the service's API token (None: none sent).
        server_problem: the problem as the service names it (a bundled name, or a path
            relative to its ``--problems-dir``); None: ``problem`` as given (a Problem: its
            name).
        wait_s: seconds one job's verdict is waited for.

    Raises:
        ProblemError: the problem cannot be loaded here.
        KernelJudgeError: the service's client is not installed (``kerneljudge[serve]``).
    """

    def __init__(
        self,
        problem: Problem | str | Path,
        server: str,
        token: str | None = None,
        *,
        server_problem: str | None = None,
        wait_s: float = 3600.0,
    ) -> None:
        try:
            from kerneljudge.service.client import JudgeClient
        except ImportError:
            raise KernelJudgeError(
                "a remote judge needs httpx: install kerneljudge[serve]"
            ) from None
        self.problem = problem if isinstance(problem, Problem) else Problem.load(problem)
        if server_problem is None:
            server_problem = problem.name if isinstance(problem, Problem) else str(problem)
        self.server_problem = server_problem
        self.server = server
        self.wait_s = wait_s
        self.client = JudgeClient(server, token=token)
        self.device_lock: Any = None  # what the local judge holds; unused here
        self.jobs = 0  # jobs judged through the service
        self._devices: dict[str, DeviceInfo] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the HTTP client (jobs already sent are the service's)."""
        self.client.close()

    def judge(self, cand: Candidate, options: JudgeOptions) -> Verdict:
        """The service's verdict of ``cand`` judged with ``options``.

        Raises:
            DeviceError: the service has no device of the kind the candidate needs.
            ProblemError: the service cannot load the problem, or its reference fails.
            KernelJudgeError: the service refused the job, gave it no verdict, gave none in
                ``wait_s`` seconds, or could not be reached for a minute (one line).
        """
        from kerneljudge.executors.base import Job, JobError
        from kerneljudge.service.client import ServiceError

        job = Job(
            problem=self.server_problem,
            source=cand.source,
            options=options,
            job_id=f"env-{uuid.uuid4().hex}",
            name=cand.name,
        )
        deadline = time.monotonic() + self.wait_s
        try:
            self._call(lambda: self.client.submit(job), deadline)
            left = max(1.0, deadline - time.monotonic())
            verdict: Verdict = self._call(
                lambda: self.client.result(job.job_id, wait=left), deadline
            )
        except JobError as exc:
            if exc.kind == "device":
                raise DeviceError(str(exc)) from None
            if exc.kind == "problem":
                raise ProblemError(str(exc)) from None
            raise KernelJudgeError(f"the judge service gave no verdict: {exc}") from None
        except ServiceError as exc:
            raise KernelJudgeError(f"the judge service: {exc}") from None
        except TimeoutError as exc:
            raise KernelJudgeError(f"the judge service: {exc}") from None
        with self._lock:
            self.jobs += 1
        return verdict

    def _call(self, fn: Any, deadline: float) -> Any:
        """``fn()``, again after a 429 (its Retry-After) until ``deadline``, and again after a
        failure to reach the service for up to :data:`UNREACHABLE_RETRY_S` (job ids make a
        repeated submission the same job)."""
        from kerneljudge.service.client import QueueFullError, ServiceError

        unreachable_since: float | None = None
        while True:
            try:
                return fn()
            except QueueFullError as exc:
                wait = max(0.1, exc.retry_after_s)
                if time.monotonic() + wait > deadline:
                    raise
                time.sleep(wait)
            except ServiceError as exc:
                if exc.status != 0:
                    raise
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > UNREACHABLE_RETRY_S or now > deadline:
                    raise
                time.sleep(2.0)

    def device_info(self, device: str) -> DeviceInfo:
        """The device the service judges ``device`` candidates on (``cpu``, ``cuda``,
        ``cuda:N``), from the verdict of a source that stops at its static check (asked once
        per device). A service that gives no verdict for it for another reason: a
        :class:`DeviceInfo` that says only the kind asked for.

        Raises:
            DeviceError: the service has no such device.
        """
        if device in self._devices:
            return self._devices[device]
        options = JudgeOptions(device=device, trials=1, timing=False, shape_sets=("public",))
        info = None
        try:
            info = self.judge(Candidate.from_source(_PROBE_SOURCE, name="probe"), options).device
        except DeviceError:
            raise
        except KernelJudgeError:
            pass
        if info is None:
            kind = "cuda" if device.startswith("cuda") else "cpu"
            info = DeviceInfo(kind=kind, name=f"the judge service's {kind} device")
        self._devices[device] = info
        return info

    def resolve_device(self, device: str) -> str:
        """``auto`` becomes ``cuda`` when the service judges on a GPU, else ``cpu`` (as
        :func:`~kerneljudge.env._context.resolve_env_device` does here); others pass through.
        """
        if device != "auto":
            return device
        try:
            self.device_info("cuda")
        except DeviceError:
            return "cpu"
        return "cuda"


class RemoteSession:
    """:class:`~kerneljudge.env._context.JudgeSession`'s methods on a :class:`RemoteJudge`.

    Args:
        config: the environment's configuration.
        judge: the remote judge.
        owns_judge: close the judge on :meth:`close`.
    """

    def __init__(self, config: EnvConfig, judge: RemoteJudge, owns_judge: bool = False) -> None:
        self.config = config
        self.judge = judge
        self._owns_judge = owns_judge
        self.lock: Any = threading.Lock()  # never held while a job is judged
        self._device: str | None = None

    @property
    def device(self) -> str:
        """The device candidates run on: ``auto`` resolved by :meth:`RemoteJudge.resolve_device`
        (asked of the service once)."""
        if self._device is None:
            self._device = self.judge.resolve_device(self.config.device)
        return self._device

    @property
    def problem(self) -> Problem:
        return self.judge.problem

    def device_info(self) -> DeviceInfo:
        """The device candidates run on (see :meth:`RemoteJudge.device_info`)."""
        return self.judge.device_info(self.device)

    def close(self) -> None:
        if self._owns_judge:
            self.judge.close()

    def usable(self, cand: Candidate) -> None:
        """A GPU candidate on a CPU environment is refused here, before any job.

        Raises:
            DeviceError: the candidate needs a GPU and the environment is on the CPU.
        """
        if cand.needs_gpu and self.device == "cpu":
            raise DeviceError("the candidate needs a CUDA GPU; the environment runs on the CPU")

    def _options(self, **kw: Any) -> JudgeOptions:
        return JudgeOptions(
            device=self.device,
            tolerance=self.config.tolerance,
            build_timeout_s=self.config.build_timeout_s,
            run_timeout_s=self.config.run_timeout_s,
            baselines=tuple(self.config.baselines),
            graph_timing=self.config.graph_timing,
            **kw,
        )

    def build(self, cand: Candidate) -> BuildResult:
        """``compile_kernel``: the build result of a one-trial job without timing (the
        service has no build-only job)."""
        self.usable(cand)
        options = self._options(trials=1, shape_sets=("public",), timing=False)
        verdict = self.judge.judge(cand, options)
        if verdict.build is not None:
            return verdict.build
        return BuildResult(ok=False, backend=cand.backend, log=verdict.reason)

    def check(self, cand: Candidate) -> Verdict:
        """``run_correctness``: the public shapes, ``trials`` trials, no timing."""
        self.usable(cand)
        options = self._options(trials=self.config.trials, shape_sets=("public",), timing=False)
        return self.judge.judge(cand, options)

    def benchmark(self, cand: Candidate) -> Verdict:
        """``run_benchmark``: one trial, then timing against the configured baselines."""
        self.usable(cand)
        options = self._options(
            trials=1, shape_sets=("public",), timing=True, max_time_s=self.config.benchmark_time_s
        )
        return self.judge.judge(cand, options)

    def profile(self, cand: Candidate) -> tuple[list[dict[str, Any]], str]:
        """No profile through the service: no rows and :data:`PROFILE_NOTE`."""
        return [], PROFILE_NOTE

    def submit(self, cand: Candidate) -> Verdict:
        """``submit_kernel``: every shape set, ``submit_trials`` trials, the service's fresh
        secret seeds."""
        self.usable(cand)
        sets = self.config.submit_shape_sets or tuple(self.problem.shape_sets) or ("public",)
        options = self._options(
            trials=self.config.submit_trials,
            shape_sets=tuple(sets),
            timing=True,
            max_time_s=self.config.submit_time_s,
        )
        return self.judge.judge(cand, options)
