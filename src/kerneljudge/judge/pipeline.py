"""The judge's pipeline for one candidate: build -> load -> trials -> timing -> verdict.

Each stage is a method of :class:`Judge` that returns what the next needs or raises: a
:class:`~kerneljudge.judge.outcome.Decided` when it decided the verdict early (a failed build,
an import error, wrong outputs), or one of the candidate's failures (``CANDIDATE_FAILURES`` of
:mod:`kerneljudge.judge.outcome`), which :meth:`Judge._judge` turns into a verdict in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneljudge.build import BuildCache, build, known_build, toolchain
from kerneljudge.candidate import Candidate
from kerneljudge.candidate.policy import requires_custom_kernel, static_issues, static_reason
from kerneljudge.check.limits import RunLimits, SetLimits
from kerneljudge.check.memory import check_budget, reply_limit
from kerneljudge.check.trials import Trials, run_trials
from kerneljudge.device import build_arch, describe_device, named_device, resolve_device
from kerneljudge.errors import WorkerError
from kerneljudge.judge.config import JudgeConfig
from kerneljudge.judge.loading import load_candidate
from kerneljudge.judge.outcome import (
    CANDIDATE_FAILURES,
    Decided,
    Stopwatch,
    VerdictWriter,
    build_failure,
    versions,
)
from kerneljudge.judge.reference_side import Prepared, ReferenceSide, reference_environment
from kerneljudge.problem import Problem
from kerneljudge.timing.stage import time_candidate
from kerneljudge.verdict import (
    BuildResult,
    DeviceInfo,
    Status,
    TrialResult,
    Verdict,
)
from kerneljudge.worker import WorkerPool, WorkerProcess
from kerneljudge.worker.confine import layers as confinement_layers
from kerneljudge.worker.spares import Spares

__all__ = ["Judge"]


class Judge:
    """Judges candidates for one problem; holds its workers and build cache between calls.

    Use as a context manager (or call :meth:`close`) so that worker processes end.

    Args:
        problem: a :class:`Problem`, a bundled problem name, or a path.
        config: how to judge.
        spares: where its processes are taken from (:class:`~kerneljudge.worker.spares.Spares`;
            None: started for this judge): the probe child of a problem file this process has
            not probed yet, the reference worker started with the judge (where the device is
            named), and its candidate workers; the spares kept there are stopped from a
            candidate's load to the end of its verdict.

    Attributes:
        reference: the reference's side of its verdicts (sessions, the pending preparation).

    Raises:
        ProblemError: the problem cannot be loaded.
        ConfigError: the build cache's folder cannot be written (field ``cache_dir``).
    """

    def __init__(
        self,
        problem: Problem | str | Path,
        config: JudgeConfig | None = None,
        *,
        spares: Spares | None = None,
    ) -> None:
        self.config = config or JudgeConfig()
        self.spares = spares
        self.cache = BuildCache(self.config.cache_dir)
        self.cache.check_writable()
        self._pools: dict[str, WorkerPool] = {}
        self._devices: dict[str, DeviceInfo] = {}
        # A problem file is probed first (a fresh interpreter, seconds): where the device is
        # named, the workers a first verdict needs start meanwhile, loading nothing before it.
        early = None if isinstance(problem, Problem) else named_device(self.config.device)
        started: dict[str, WorkerProcess] = {}
        gpu = early is not None and early.startswith("cuda")
        ref_env = reference_environment(self.cache.root)
        try:
            if early is not None:
                started[early] = self._reference_worker(early, ref_env)
                if spares is None or not spares.kept():  # none ahead: started beside the probe
                    pool = self._new_pool(early, record_ops=False)
                    pool.spares = None  # (a guess of the kind: not one the spares should keep)
                    pool.prestart()
                    pool.spares = spares
            self.problem = (
                problem
                if isinstance(problem, Problem)
                else Problem.load(problem, gpu_judge=gpu, spares=spares)
            )
            record_ops = requires_custom_kernel(self.problem.policy)
            for pool in self._pools.values():
                if record_ops:  # its workers lack the recording's warm-up: started again at need
                    pool.close()
                pool.record_ops = record_ops
            if early is not None and early not in self._pools and spares is not None:
                self._new_pool(early, record_ops).prestart()
            self.reference = ReferenceSide(
                self.problem, self.config.seed, self.config.threads, ref_env
            )
            self.reference.early.update(started)
        except BaseException:
            with contextlib.ExitStack() as ending:  # every one ended, even if one raises
                for end in [w.close for w in started.values()]:
                    ending.callback(end)
                for end in [p.close for p in self._pools.values()]:
                    ending.callback(end)
            raise
        #: A lock held by everything that runs on the judging device and is shared with other
        #: judges on it (see :class:`kerneljudge.env.KernelEnv`); work this judge does ahead
        #: of need takes it first. None: this judge has the device to itself.
        self.device_lock: Any = None
        #: Called with a short line at the start of each long stage of :meth:`evaluate`
        #: (``"building x.py (cpp)"``, ``"trial 2/5"``, ``"timing"``); None: nothing is said.
        self.progress: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ resources
    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every worker this judge started: the candidate workers first, then the reference
        side (its workers and its preparation thread), even when a pool fails to close."""
        try:
            for pool in self._pools.values():
                pool.close()
            self._pools.clear()
        finally:
            self.reference.close()

    def _pool(self, device: str) -> WorkerPool:
        if self.reference.closed:
            raise WorkerError("the judge was closed")
        if device not in self._pools:
            self._new_pool(device, requires_custom_kernel(self.problem.policy))
        return self._pools[device]

    def _reference_worker(self, device: str, env: dict[str, str]) -> WorkerProcess:
        start = functools.partial(
            WorkerProcess, "reference", device, dict(env), self.config.threads
        )
        if self.spares is None:
            return start()
        key = ("reference", device, tuple(sorted(env.items())), self.config.threads)
        return self.spares.take(key, start)

    def _new_pool(self, device: str, record_ops: bool) -> WorkerPool:
        home = toolchain.cuda_home()
        env = {"CUDA_HOME": home} if home else {}
        # Two ahead on a GPU: a worker needs seconds to import torch and create its context,
        # is stopped while a verdict is timed, and an agent's calls can come back to back.
        size = 2 if device.startswith("cuda") else 1
        self._pools[device] = WorkerPool(
            device,
            env,
            size=size,
            threads=self.config.threads,
            record_ops=record_ops,
            writable=(str(self.cache.root / "builds"),),
            spares=self.spares,
        )
        return self._pools[device]

    def device_info(self, device: str) -> DeviceInfo:
        if device not in self._devices:
            self._devices[device] = describe_device(device)
        return self._devices[device]

    def arch_for(self, device: str | None) -> str:
        """The CUDA arch candidates are built for (see :func:`kerneljudge.device.build_arch`)."""
        return build_arch(device)

    @contextlib.contextmanager
    def configured(self, **changes: Any) -> Any:
        """Judge with some :class:`JudgeConfig` fields changed inside a ``with`` block.

        Meant for per-call knobs (``trials``, ``shape_sets``, ``timing``, ``baselines``,
        ``timing_config``, ``seed`` of the inputs); the workers, build cache and weights stay.
        Not thread-safe, like the judge itself.

        Raises:
            TypeError: a name that is not a :class:`JudgeConfig` field.
            ConfigError: a value out of its field's range.
        """
        saved = self.config
        self.config = dataclasses.replace(saved, **changes)
        try:
            yield self
        finally:
            self.config = saved

    # ------------------------------------------------------------------ stages
    def build(self, candidate: Candidate | str | Path, device: str | None = None) -> BuildResult:
        """Build (or fetch from the cache) without running anything.

        Raises:
            CandidateError: a candidate path that cannot be read.
        """
        cand = _as_candidate(candidate)
        return build(
            cand,
            cache=self.cache,
            arch=self.arch_for(device),
            timeout_s=self.config.build_timeout_s,
        )

    def evaluate(self, candidate: Candidate | str | Path, *, seed: int | None = None) -> Verdict:
        """Judge one candidate: build, correctness trials, and (when correct) timing.

        Args:
            candidate: a :class:`Candidate`, or a path to a candidate file.
            seed: the run seed for this evaluation's inputs (None: a fresh secret one).

        Returns:
            The :class:`Verdict`; every failure of the candidate is a status in it.

        Raises:
            CandidateError: the candidate file cannot be read.
            DeviceError: the candidate needs a GPU and none is visible.
            ProblemError: the reference failed before the candidate ran (it fails on its own).
            BuildCacheError: the build cache could not be written.
            WorkerError: another harness failure.
        """
        cand = _as_candidate(candidate)
        device = resolve_device(self.config.device, cand.needs_gpu)
        verdict = self._judge(cand, device, seed)
        if self.reference.pending is None:  # this verdict used its preparation: start the next
            self.reference.prepare_ahead(self.config, device, self.device_lock)
        return verdict

    def _judge(self, cand: Candidate, device: str, seed: int | None) -> Verdict:
        """:meth:`evaluate` of one candidate on one device."""
        clock = Stopwatch()
        pool = self._pool(device)
        pool.prestart()  # the worker starts while the build runs
        run_seed, secret, reused = self.reference.claim(self.config, device, seed)
        out = self._writer(cand, device, clock)
        try:
            self._check_source(cand)
            result, worker = self._build_stage(cand, device, (run_seed, secret, reused), clock)
        except Decided as early:
            return out.decided(early)
        done: list[TrialResult] = []  # the trials so far, for the verdict of a failure
        with contextlib.ExitStack() as running:
            running.callback(worker.close)
            try:
                prepared, limits = self._reference_stage(worker, device, run_seed, clock)
                out.reductions.trials(prepared)
                out.base["limits"] = RunLimits(self.config.run_timeout_s).record(limits)
                # The pool's workers (this one's replacement is starting up) wait, stopped,
                # until the verdict ends: beside a starting worker, a trial of a 0.01 s
                # candidate took 0.12 s on a 2-core machine
                # (docs/benchmarks/2026-11-30-cpu-verdict-stages.md).
                running.enter_context(pool.paused())
                if self.spares is not None:
                    running.enter_context(self.spares.paused())
                self._load_stage(worker, cand, result, device, clock, out.base["limits"].load_s)
                trials = self._trials_stage(worker, device, prepared, limits, result, done, clock)
                return self._timing_stage(
                    out, worker, device, prepared, limits, trials, result, clock
                )
            except Decided as early:
                return out.decided(early)
            except CANDIDATE_FAILURES as exc:
                rule = (self.config.tolerance, *self._tolerances())
                return out.failure(exc, result, worker, done, rule)

    def _writer(self, cand: Candidate, device: str, clock: Stopwatch) -> VerdictWriter:
        """The writer of ``cand``'s verdict on ``device``, with the fields known at the start."""
        return VerdictWriter(
            clock,
            problem=self.problem.name,
            candidate_sha256=cand.sha256,
            backend=cand.backend,
            device=self.device_info(device),
            versions=versions(),
            started_at=clock.started_at,
            confinement=confinement_layers("candidate", device),
        )

    def _check_source(self, cand: Candidate) -> None:
        """Reject, before any build, source that breaks the problem's custom-kernel policy."""
        policy = self.problem.policy
        if requires_custom_kernel(policy) and not cand.static_issues():
            issues = static_issues(cand.source, cand.backend, policy)
            if issues:
                raise Decided(Status.REJECTED, static_reason(issues[0]))

    def _build_stage(
        self, cand: Candidate, device: str, claim: tuple[int, bool, bool], clock: Stopwatch
    ) -> tuple[BuildResult, WorkerProcess]:
        """Build (the reference's work starts beside it) and take a candidate worker.

        Raises:
            Decided: the build failed.
        """
        run_seed, secret, reused = claim
        # The reference's work starts beside the build, unless the build is known to have
        # failed already (then the verdict is immediate and leaves nothing running).
        result = known_build(cand, cache=self.cache, arch=self.arch_for(device))
        started_here = not reused and (result is None or result.ok)
        if started_here:
            self.reference.begin(self.config, device, run_seed, secret)
        try:
            if result is None or result.cached:  # (a syntax error is known before any build)
                self._say("build cached" if result else f"building {cand.name} ({cand.backend})")
            result = result or self.build(cand, device)
            clock.lap("build")
            if result.ok:
                self._say("starting the candidate's worker")
            worker = self._pool(device).take() if result.ok else None
            clock.lap("worker")
        except BaseException:
            if started_here:
                self.reference.finish_alone(self.device_lock)
            raise
        if worker is None:
            if started_here:
                self.reference.finish_alone(self.device_lock)
            raise build_failure(result)
        return result, worker

    def _reference_stage(
        self, worker: WorkerProcess, device: str, run_seed: int, clock: Stopwatch
    ) -> tuple[Prepared, dict[str, SetLimits]]:
        """The reference's trials (waited for), checked against the memory budget (the worker's
        reply limit follows), and each shape set's request limits (:meth:`ReferenceSide.limits`).
        Before any of the candidate's code runs, so a reference failure so far is not its.

        Raises:
            ProblemError: the reference fails on its own, or the trials do not fit the budget.
        """
        self._say("preparing the reference")
        prepared = self.reference.take(self.config, device, run_seed)
        budget = check_budget(
            [held for runs in prepared.values() for held in runs],
            self.config.memory_budget_mib << 20,
            self.problem.name,
            not device.startswith("cuda"),  # on a GPU the workers draw the inputs
        )
        worker.reply_limit_bytes = reply_limit(budget)
        limits = self.reference.limits(self.config, device, prepared)
        clock.lap("reference")
        return prepared, limits

    def _load_stage(
        self,
        worker: WorkerProcess,
        cand: Candidate,
        result: BuildResult,
        device: str,
        clock: Stopwatch,
        limit_s: float,
    ) -> None:
        """Import the candidate in its worker, within ``limit_s`` seconds.

        Raises:
            Decided: the import of an import-only backend failed (a compile error).
        """
        self._say("loading the candidate")
        failed_import = load_candidate(
            self.cache, worker, cand, result, self.arch_for(device), limit_s
        )
        clock.lap("load")
        if failed_import is not None:
            first = failed_import.messages[0]
            where = f"line {first.candidate_line}: " if first.candidate_line else ""
            raise Decided(Status.COMPILE_ERROR, where + first.message, build=failed_import)

    def _trials_stage(
        self,
        worker: WorkerProcess,
        device: str,
        prepared: Prepared,
        limits: dict[str, SetLimits],
        result: BuildResult,
        done: list[TrialResult],
        clock: Stopwatch,
    ) -> Trials:
        """The correctness trials (:func:`kerneljudge.check.trials.run_trials`).

        Raises:
            Decided: a trial failed (``incorrect``).
        """
        atol, rtol = self._tolerances()
        trials = run_trials(
            worker,
            prepared,
            functools.partial(self.reference.session, device),
            limits=limits,
            atol=atol,
            rtol=rtol,
            mode=self.config.tolerance,
            policy=self.problem.policy,
            kept_set=list(prepared)[-1] if self.config.timing else None,
            done=done,
            say=self._say,
        )
        clock.lap("trials")
        if not trials.check.passed:
            raise Decided(Status.INCORRECT, trials.failure(), build=result, check=trials.check)
        return trials

    def _timing_stage(
        self,
        out: VerdictWriter,
        worker: WorkerProcess,
        device: str,
        prepared: Prepared,
        limits: dict[str, SetLimits],
        trials: Trials,
        result: BuildResult,
        clock: Stopwatch,
    ) -> Verdict:
        """The verdict of a correct candidate: timed against the baselines on the timed (last)
        shape set's trials (:func:`kerneljudge.timing.stage.time_candidate`) unless timing is
        off."""
        if not self.config.timing:
            return out.write(Status.CORRECT, "", build=result, check=trials.check)
        timed_set = list(prepared)[-1]
        self._say("timing")
        atol, rtol = self._tolerances()
        session = trials.sessions[timed_set]
        out.reductions.audits = (session, session.host_oracles)  # read when it is written
        timing, status, note = time_candidate(
            self.config,
            self.device_info(device),
            worker,
            session,
            prepared[timed_set],
            atol,
            rtol,
            limits[timed_set],
        )
        clock.lap("timing")
        return out.write(status, note, build=result, check=trials.check, timing=timing)

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def profile(
        self, candidate: Candidate | str | Path, *, calls: int = 5, seed: int | None = None
    ) -> list[dict[str, Any]]:
        """:func:`kerneljudge.judge.profiling.profile_candidate` with this judge."""
        from kerneljudge.judge.profiling import profile_candidate

        return profile_candidate(self, _as_candidate(candidate), calls=calls, seed=seed)

    def _tolerances(self) -> tuple[float, float]:
        atol, rtol = self.problem.tolerance
        return (
            self.config.atol if self.config.atol is not None else atol,
            self.config.rtol if self.config.rtol is not None else rtol,
        )


def _as_candidate(candidate: Candidate | str | Path) -> Candidate:
    return candidate if isinstance(candidate, Candidate) else Candidate.from_file(candidate)
