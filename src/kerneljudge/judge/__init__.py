"""The judge: build -> check -> timing -> verdict, for one problem and any number of candidates.

Process model: this (supervisor) process never imports candidate code. Builds run in a build
worker with no GPU visible; each candidate runs in a fresh candidate worker (taken from a pool
started ahead of need) that is discarded afterwards; the reference runs and is timed in a
separate, trusted reference worker on the same device. Inputs are drawn from a secret per-run
seed; each trial's inputs, reference outputs and float64 oracle stay in the reference worker,
which also compares the candidate's outputs with them (in float64 on the CPU, the same code as
ever: :func:`kerneljudge.check.compare_outputs`). This process only relays one trial's inputs
or outputs at a time, and checks before the trials that it can (:mod:`kerneljudge.check.memory`).

The reference's part of a verdict (its worker's start, its outputs and float64 oracle on every
trial's inputs, the ``torch.compile`` of the baseline) runs on a helper thread while the
candidate builds, so a cold verdict costs little more than its build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import platform
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from kerneljudge.build import (
    IMPORT_ONLY_BACKENDS,
    BuildCache,
    build,
    clear_stale_batons,
    known_build,
    toolchain,
)
from kerneljudge.build.log import shape_log
from kerneljudge.candidate import Candidate
from kerneljudge.candidate.policy import (
    forbidden_ops_used,
    ops_reason,
    requires_custom_kernel,
    static_issues,
    static_reason,
)
from kerneljudge.check.memory import check_budget, reply_limit
from kerneljudge.check.reference import HeldTrial, ReferenceFailed, ReferenceSession, first_line
from kerneljudge.device import build_arch, describe_device, resolve_device
from kerneljudge.errors import ProblemError, WorkerError
from kerneljudge.problem import Problem
from kerneljudge.timing import TimingConfig
from kerneljudge.timing.stage import time_candidate
from kerneljudge.verdict import (
    BuildResult,
    CheckResult,
    CompilerMessage,
    DeviceInfo,
    Status,
    TrialResult,
    Verdict,
)
from kerneljudge.worker import CandidateFault, WorkerDied, WorkerPool, WorkerProcess, WorkerTimeout
from kerneljudge.worker.confine import layers as confinement_layers

__all__ = ["Judge", "JudgeConfig", "judge"]


@dataclass(frozen=True)
class JudgeConfig:
    """How to judge. Every field has a CLI option of the same name.

    Attributes:
        device: ``auto`` (GPU for cuda/triton, CPU for cpp/torch), ``cpu``, ``cuda``, ``cuda:N``.
        trials: correctness trials per shape set, each with fresh inputs.
        tolerance: ``oracle`` (float64-oracle rule) or ``allclose`` (see :mod:`kerneljudge.check`).
        atol, rtol: override the problem's allclose tolerances.
        shape_sets: which of the problem's shape sets to check; timing uses the last one.
        timing: time a correct candidate.
        baselines: reference baselines to time: ``eager`` and/or ``compile`` (torch.compile).
        timing_config: the timing protocol's knobs.
        build_timeout_s: limit of one build (seconds).
        run_timeout_s: limit of one request to a candidate worker: import, one trial (seconds).
            A timing batch's limit scales with the calls it asks for, from this floor up to 5x
            it (:class:`kerneljudge.timing.BatchLimit`).
        cache_dir: the build cache (None: :func:`kerneljudge.build.default_cache_dir`).
        seed: the run seed (None: a fresh secret one per evaluation).
        memory_budget_mib: memory this process may use above its base to relay one trial (MiB;
            0: the host's available memory when the trials start); a problem whose trials
            need more is a :class:`~kerneljudge.errors.ProblemError`
            (:func:`kerneljudge.check.memory.check_budget`), and a candidate's reply longer than
            half of it ends its worker unread: ``runtime_error``.
        threads: torch threads in the workers (0: torch's default). While timing on a CPU,
            both timed workers run one thread per timing core, or this many when fewer
            (:func:`kerneljudge.timing.hostload.timing_cores`).
    """

    device: str = "auto"
    trials: int = 5
    tolerance: str = "oracle"
    atol: float | None = None
    rtol: float | None = None
    shape_sets: tuple[str, ...] = ("public",)
    timing: bool = True
    baselines: tuple[str, ...] = ("eager", "compile")
    timing_config: TimingConfig = field(default_factory=TimingConfig)
    build_timeout_s: float = 300.0
    run_timeout_s: float = 120.0
    cache_dir: Path | None = None
    seed: int | None = None
    memory_budget_mib: int = 0
    threads: int = 0


Prepared = dict[str, list[HeldTrial]]


class _Dropped(Exception):
    """A preparation nobody needs any more, stopped before it started."""


class _Preparation:
    """The reference's part of one verdict (:meth:`Judge._prepare`), on a thread of its own.

    Preparations run one at a time, in order (each first waits for the one before it: they
    share the reference workers). One made ahead of need waits for ``lock``, the device lock of
    everything timed on the same device, unless whoever needs it holds that lock already
    (:meth:`result`) or it was dropped.

    Attributes:
        key: what it depends on besides the seed (see :func:`_preparation_key`).
        run_seed: the seed of its inputs.
        secret: the seed was drawn here, not given by the caller.
    """

    def __init__(
        self,
        key: tuple[Any, ...],
        run_seed: int,
        secret: bool,
        run: Callable[[], Prepared],
        after: _Preparation | None,
        lock: Any = None,
    ) -> None:
        self.key, self.run_seed, self.secret = key, run_seed, secret
        self.dropped = False
        self._future: Future[Prepared] = Future()
        self._lock_held_by_caller = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(run, after, lock), name="kerneljudge-reference", daemon=True
        )
        self._thread.start()

    def _main(self, run: Callable[[], Prepared], after: _Preparation | None, lock: Any) -> None:
        try:
            if after is not None:
                after.join()
            while lock is not None and not self._lock_held_by_caller.is_set():
                if self.dropped:
                    raise _Dropped
                if lock.acquire(timeout=0.05):
                    try:
                        if self.dropped:
                            raise _Dropped
                        self._future.set_result(run())
                        return
                    finally:
                        lock.release()
            if self.dropped:
                raise _Dropped
            self._future.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            self._future.set_exception(exc)

    def result(self) -> Prepared:
        """Wait for the result (the caller holds the device lock, if there is one).

        Raises:
            ReferenceFailed, WorkerError: as :meth:`Judge._prepare`.
        """
        self._lock_held_by_caller.set()
        return self._future.result()

    def drop(self) -> None:
        """Nobody will use the result: skip the work if it has not started."""
        self.dropped = True
        self._lock_held_by_caller.set()

    def join(self) -> None:
        self._thread.join()


def _preparation_key(config: JudgeConfig, device: str) -> tuple[Any, ...]:
    """What a reference preparation depends on, besides its run seed."""
    return (
        device,
        config.trials,
        config.shape_sets,
        config.tolerance,
        config.timing and "compile" in config.baselines,
        config.run_timeout_s,
    )


def _derive(seed: int, *parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def _versions() -> dict[str, str]:
    out = {
        "kerneljudge": _kerneljudge_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
    triton = _pkg_version("triton")
    if triton != "unknown":
        out["triton"] = triton
    return out


def _kerneljudge_version() -> str:
    from kerneljudge import __version__

    return __version__


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Judge:
    """Judges candidates for one problem; holds its workers and build cache between calls.

    Use as a context manager (or call :meth:`close`) so that worker processes end.

    Args:
        problem: a :class:`Problem`, a bundled problem name, or a path.
        config: how to judge.

    Raises:
        ProblemError: the problem cannot be loaded.
    """

    def __init__(self, problem: Problem | str | Path, config: JudgeConfig | None = None) -> None:
        self.problem = problem if isinstance(problem, Problem) else Problem.load(problem)
        self.config = config or JudgeConfig()
        self.cache = BuildCache(self.config.cache_dir)
        self._weight_seed = (
            self.config.seed if self.config.seed is not None else secrets.randbits(62)
        )
        self._pools: dict[str, WorkerPool] = {}
        self._refs: dict[tuple[str, str], ReferenceSession] = {}
        self._devices: dict[str, DeviceInfo] = {}
        # The latest reference preparation; while one runs, the reference sessions are its.
        self._prep: _Preparation | None = None
        self._closed = False
        self._refs_lock = threading.Lock()
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
        """End every worker this judge started."""
        with self._refs_lock:
            self._closed = True
        if self._prep is not None:
            self._prep.drop()
        for pool in self._pools.values():
            pool.close()
        with self._refs_lock:  # no reference is started after this
            running = list(self._refs.values())
        for ref in running:
            ref.kill()  # a running preparation fails at once
        self._settle()
        for ref in list(self._refs.values()):
            ref.close()
        self._pools.clear()
        self._refs.clear()

    def _settle(self) -> None:
        """Drop the latest reference preparation and wait until none runs."""
        prep, self._prep = self._prep, None
        if prep is not None:
            prep.drop()
            prep.join()

    def _finish_alone(self) -> None:
        """A verdict ends before the reference work it started: where the device is shared
        (``device_lock``, held by the caller), that work must not go on after the caller lets
        the lock go, so it is waited for here. It stays usable by the next verdict: no
        candidate saw its inputs."""
        if self.device_lock is not None and self._prep is not None:
            self._prep.join()

    def _begin_preparation(
        self, device: str, run_seed: int, secret: bool, lock: Any = None
    ) -> None:
        run = functools.partial(self._prepare, self.config, device, run_seed)
        key = _preparation_key(self.config, device)
        self._prep = _Preparation(key, run_seed, secret, run, after=self._prep, lock=lock)

    def _prepare_ahead(self, device: str) -> None:
        """Prepare the reference for the next verdict now, with a fresh secret run seed, while
        nothing is timed (an agent's next call comes seconds later); :meth:`evaluate` uses it
        when its configuration and device match and no seed is asked for."""
        if self.config.seed is None and not self._closed:
            self._begin_preparation(device, secrets.randbits(62), True, lock=self.device_lock)

    def _pool(self, device: str) -> WorkerPool:
        if self._closed:
            raise WorkerError("the judge was closed")
        if device not in self._pools:
            env = {"CUDA_HOME": toolchain.cuda_home()} if toolchain.cuda_home() else {}
            # Two ahead on a GPU: a worker needs seconds to import torch and create its context,
            # is stopped while a verdict is timed, and an agent's calls can come back to back.
            size = 2 if device.startswith("cuda") else 1
            self._pools[device] = WorkerPool(
                device,
                env,
                size=size,
                threads=self.config.threads,
                record_ops=requires_custom_kernel(self.problem.policy),
                writable=(str(self.cache.root / "builds"),),
            )
        return self._pools[device]

    def _reference(self, device: str, shape_set: str) -> ReferenceSession:
        key = (device, shape_set)
        with self._refs_lock:
            if self._closed:
                raise WorkerError("the judge was closed")
            if key in self._refs and self._refs[key].failed:
                self._refs.pop(key).close()  # a dead reference is replaced, never reused
            if key not in self._refs:
                self._refs[key] = ReferenceSession(
                    self.problem, shape_set, device, self._weight_seed, self.config.threads
                )
            return self._refs[key]

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
            WorkerError: another harness failure.
        """
        cand = _as_candidate(candidate)
        device = resolve_device(self.config.device, cand.needs_gpu)
        verdict = self._judge(cand, device, seed)
        if self._prep is None:  # this verdict used its preparation: start the next one
            self._prepare_ahead(device)
        return verdict

    def _judge(self, cand: Candidate, device: str, seed: int | None) -> Verdict:
        """:meth:`evaluate` of one candidate on one device."""
        started, t0 = _now(), time.monotonic()
        stages: dict[str, float] = {}
        mark = [t0]

        def stage(name: str) -> None:
            now = time.monotonic()
            stages[name] = now - mark[0]
            mark[0] = now

        pool = self._pool(device)
        pool.prestart()  # the worker starts while the build runs
        ahead = self._prep
        secret = seed is None and self.config.seed is None
        reuse = (
            secret
            and ahead is not None
            and ahead.secret
            and not ahead.dropped
            and ahead.key == _preparation_key(self.config, device)
        )
        if reuse:
            run_seed = ahead.run_seed  # prepared after the last verdict, with a fresh seed
        else:
            if ahead is not None:
                ahead.drop()
            run_seed = (
                seed
                if seed is not None
                else (self.config.seed if self.config.seed is not None else secrets.randbits(62))
            )
        base = dict(
            problem=self.problem.name,
            candidate_sha256=cand.sha256,
            backend=cand.backend,
            device=self.device_info(device),
            versions=_versions(),
            started_at=started,
            confinement=confinement_layers("candidate"),
        )

        def finish(status: Status, reason: str, **kw: Any) -> Verdict:
            return Verdict(
                status=status,
                reason=reason,
                finished_at=_now(),
                duration_s=time.monotonic() - t0,
                stage_s=dict(stages),
                **base,
                **kw,
            )

        policy = self.problem.policy
        if requires_custom_kernel(policy) and not cand.static_issues():
            issues = static_issues(cand.source, cand.backend, policy)
            if issues:
                return finish(Status.REJECTED, static_reason(issues[0]))

        # The reference's work starts beside the build, unless the build is known to have
        # failed already (then the verdict is immediate and leaves nothing running).
        result = known_build(cand, cache=self.cache, arch=self.arch_for(device))
        started_here = not reuse and (result is None or result.ok)
        if started_here:
            self._begin_preparation(device, run_seed, secret)
        try:
            if result is None or result.cached:  # (a syntax error is known before any build)
                self._say("build cached" if result else f"building {cand.name} ({cand.backend})")
            result = result or self.build(cand, device)
            stage("build")
            if result.ok:
                self._say("starting the candidate's worker")
            worker = pool.take() if result.ok else None
            stage("worker")
        except BaseException:
            if started_here:
                self._finish_alone()
            raise
        if worker is None:
            if started_here:
                self._finish_alone()
            status = (
                Status.TIMEOUT
                if result.timed_out
                else Status.REJECTED
                if result.rejected
                else Status.COMPILE_ERROR
            )
            first = next((m for m in result.messages if m.severity == "error"), None)
            where = f"line {first.candidate_line}: " if first and first.candidate_line else ""
            return finish(
                status, where + (first.message if first else "build failed"), build=result
            )

        trials: list[TrialResult] = []
        atol, rtol = self._tolerances()
        idle_stopped = contextlib.ExitStack()
        try:
            # Before any of this candidate's code runs: a reference failure so far is not its.
            self._say("preparing the reference")
            prepared = self._await_prepared(device, run_seed)
            budget = check_budget(
                [held for runs in prepared.values() for held in runs],
                self.config.memory_budget_mib << 20,
                self.problem.name,
            )
            # A reply larger than the judge can relay ends the worker, unread.
            worker.reply_limit_bytes = reply_limit(budget)
            stage("reference")
            # The pool's workers (this one's replacement is starting up) wait, stopped, until
            # the verdict ends: beside a starting worker, a trial of a 0.01 s candidate took
            # 0.12 s on a 2-core machine (docs/benchmarks/2026-11-30-cpu-verdict-stages.md).
            idle_stopped.enter_context(pool.paused())
            self._say("loading the candidate")
            failed_import = self._load(worker, cand, result, device)
            stage("load")
            if failed_import is not None:
                first = failed_import.messages[0]
                return finish(
                    Status.COMPILE_ERROR,
                    (f"line {first.candidate_line}: " if first.candidate_line else "")
                    + first.message,
                    build=failed_import,
                )
            timed_set = list(prepared)[-1]
            timeout = self.config.run_timeout_s
            for shape_set, runs in prepared.items():
                ref = self._reference(device, shape_set)
                worker.request(
                    "setup", timeout, init_inputs=ref.init_inputs, state_dict=ref.state_dict
                )
                # The timed set's inputs stay in the reference worker for the timing audit.
                audited = self.config.timing and shape_set == timed_set
                for held in runs:
                    self._say(f"trial {len(trials) + 1}/{sum(map(len, prepared.values()))}")
                    got = worker.request(
                        "run",
                        timeout,
                        inputs=ref.held_inputs(held.key, timeout, forget=not audited),
                        record_ops=requires_custom_kernel(policy),
                    )
                    effect = _input_effect_violation(held.reply, got)
                    if effect:
                        return finish(Status.REJECTED, effect, build=result)
                    used = forbidden_ops_used(list(got.get("ops", [])), policy)
                    if requires_custom_kernel(policy) and used:
                        return finish(Status.REJECTED, ops_reason(used), build=result)
                    # Compared by the trusted reference worker, which holds the reference's
                    # outputs and oracle; this process lets go of the candidate's once sent.
                    trial = ref.compare(
                        held.key,
                        got.pop("outputs"),
                        timeout,
                        atol=atol,
                        rtol=rtol,
                        mode=self.config.tolerance,
                        index=len(trials),
                    )
                    trials.append(dataclasses.replace(trial, shape_set=shape_set))
            check = CheckResult(
                passed=all(t.passed for t in trials),
                trials=tuple(trials),
                mode=self.config.tolerance,
                atol=atol,
                rtol=rtol,
            )
            stage("trials")
            if not check.passed:
                bad = next(t for t in trials if not t.passed)
                return finish(
                    Status.INCORRECT,
                    f"{check.n_passed}/{len(trials)} trials passed; "
                    f"trial {bad.index}: {bad.reason}",
                    build=result,
                    check=check,
                )
            if not self.config.timing:
                return finish(Status.CORRECT, "", build=result, check=check)
            self._say("timing")
            timing, status, note = time_candidate(
                self.config, self.device_info(device), worker, ref, runs, atol, rtol
            )
            stage("timing")
            return finish(status, note, build=result, check=check, timing=timing)
        except CandidateFault as exc:
            check = (
                CheckResult(False, tuple(trials), self.config.tolerance, atol, rtol)
                if trials
                else None
            )
            return finish(
                Status.REJECTED if exc.status == "rejected" else Status.RUNTIME_ERROR,
                first_line(str(exc)),
                build=result,
                check=check,
                worker_log=str(exc) + "\n" + worker.log_tail(),
            )
        except WorkerDied as exc:
            return finish(
                Status.RUNTIME_ERROR, exc.describe(), build=result, worker_log=exc.log_tail
            )
        except WorkerTimeout as exc:
            return finish(
                Status.TIMEOUT,
                f"the candidate's {exc.op} did not finish within {exc.timeout_s:g} s",
                build=result,
                worker_log=worker.log_tail(),
            )
        except ReferenceFailed as exc:
            if not exc.had_answered:  # it never worked: the problem's error, not the candidate's
                raise _problem_failed(exc) from None
            # The candidate ran beside it: it may have killed or stopped the reference. The
            # reference is replaced for the next evaluation either way.
            return finish(
                Status.RUNTIME_ERROR,
                f"the reference worker failed while this candidate was judged: {exc}",
                build=result,
                worker_log=worker.log_tail(),
            )
        finally:
            idle_stopped.close()
            worker.close()

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def profile(
        self, candidate: Candidate | str | Path, *, calls: int = 5, seed: int | None = None
    ) -> list[dict[str, Any]]:
        """Profile the candidate's forward with torch.profiler, on the timed shape set's inputs.

        The candidate is built (a cache hit after :meth:`evaluate`), loaded in a fresh worker
        with the reference's weights, run once, then ``calls`` times under the profiler. On CUDA
        the rows are GPU kernels and copies; on the CPU, operators by self time, the forward's
        own Python and extension code being ``ModelNew.forward``.

        Returns:
            Rows ``{"name", "device_time_ms", "calls", "share"}``, largest first: time per
            forward call (ms), runs per forward call, fraction of the profiled time. Empty when
            the candidate does not build or import.

        Raises:
            CandidateFault, WorkerDied, WorkerTimeout: the candidate failed while profiled.
            WorkerError: the profiler itself failed.
            DeviceError: the candidate needs a GPU and none is visible.
        """
        cand = _as_candidate(candidate)
        device = resolve_device(self.config.device, cand.needs_gpu)
        result = self.build(cand, device)
        if not result.ok:
            return []
        shape_set = self._shape_sets()[-1]
        self._settle()
        ref = self._reference(device, shape_set)
        run_seed = seed if seed is not None else secrets.randbits(62)
        worker = self._pool(device).take()
        try:
            if self._load(worker, cand, result, device) is not None:
                return []
            timeout = self.config.run_timeout_s
            worker.request("setup", timeout, init_inputs=ref.init_inputs, state_dict=ref.state_dict)
            inputs = ref.problem.make_inputs(_derive(run_seed, shape_set, "profile"))
            worker.request("run", timeout, inputs=inputs)
            return list(worker.request("profile", timeout, calls=calls)["rows"])
        finally:
            worker.close()

    def _prepare(self, config: JudgeConfig, device: str, run_seed: int) -> Prepared:
        """The reference's part of one verdict (runs on the preparation thread).

        For each shape set (the timed one last): the trials, run by the reference and held in
        its worker (inputs, outputs, float64 oracle outputs; :meth:`ReferenceSession.run_trial`)
        with its reply on them (input effects, layouts); then the ``torch.compile`` baseline is
        compiled if it will be timed.

        Raises:
            ReferenceFailed: the reference failed.
        """
        prepared: Prepared = {}
        for shape_set in self._shape_sets(config):
            ref = self._reference(device, shape_set)
            ref.forget(config.run_timeout_s)  # what an earlier verdict left there
            prepared[shape_set] = [
                ref.run_trial(
                    i,
                    _derive(run_seed, shape_set, i),
                    config.run_timeout_s,
                    oracle=config.tolerance == "oracle",
                )
                for i in range(config.trials)
            ]
        if config.timing and "compile" in config.baselines:
            timed_set = self._shape_sets(config)[-1]
            self._reference(device, timed_set).ensure_compiled(
                max(config.run_timeout_s, 600.0), (), config.run_timeout_s
            )
        return prepared

    def _await_prepared(self, device: str, run_seed: int) -> Prepared:
        """The pending preparation's result; prepared again once, with new reference workers,
        if a reference that had worked failed meanwhile. Called before the candidate's code
        runs, so such a failure is never this candidate's."""
        prep, self._prep = self._prep, None
        assert prep is not None
        try:
            return prep.result()
        except ReferenceFailed as exc:
            if not exc.had_answered:
                raise _problem_failed(exc) from None
        try:
            return self._prepare(self.config, device, run_seed)
        except ReferenceFailed as exc:  # fresh reference workers: the problem fails on its own
            raise _problem_failed(exc) from None

    def _load(
        self, worker: WorkerProcess, cand: Candidate, result: BuildResult, device: str
    ) -> BuildResult | None:
        """Import the built candidate in its worker.

        Returns None on success. For backends whose build *is* the import (``torch``,
        ``triton``) an import failure is a compile error: the failed :class:`BuildResult` is
        returned. For compiled backends it is a runtime error (the fault propagates).
        """
        entry = self.cache.entry(result.cache_key)
        clear_stale_batons(self.cache, result.cache_key)
        try:
            worker.request(
                "load_candidate",
                self.config.run_timeout_s,
                path=str(entry / "candidate.py"),
                env=toolchain.build_environment(self.arch_for(device), entry / "ext"),
            )
        except CandidateFault as exc:
            if cand.backend not in IMPORT_ONLY_BACKENDS or exc.status == "rejected":
                raise
            text = str(exc).removeprefix("importing the candidate failed: ")
            msg = CompilerMessage(
                cand.name, exc.lineno, None, "error", first_line(text), exc.lineno
            )
            log = shape_log([msg], text, cand.source, cand.name)
            return dataclasses.replace(result, ok=False, messages=(msg,), log=log)
        return None

    def _shape_sets(self, config: JudgeConfig | None = None) -> list[str]:
        """The configured shape sets, the public one last (it is the one timed)."""
        sets = list(dict.fromkeys((config or self.config).shape_sets))
        if "public" in sets:
            sets.remove("public")
            sets.append("public")
        return sets

    def _tolerances(self) -> tuple[float, float]:
        atol, rtol = self.problem.tolerance
        return (
            self.config.atol if self.config.atol is not None else atol,
            self.config.rtol if self.config.rtol is not None else rtol,
        )


def _input_effect_violation(reference: dict[str, Any], candidate: dict[str, Any]) -> str:
    """Why the candidate's treatment of its inputs is a cheat, if it is (the reference's own
    behaviour is allowed: a reference that returns a view may be matched by one)."""
    if candidate.get("aliases_input") and not reference.get("aliases_input"):
        return "forward returned a view of one of its inputs"
    changed = sorted(
        set(candidate.get("modified_inputs", [])) - set(reference.get("modified_inputs", []))
    )
    if changed:
        return f"forward changed its input {changed[0]} in place"
    return ""


def _problem_failed(exc: ReferenceFailed) -> ProblemError:
    """A reference that failed before it ever ran to the end: the problem's own error."""
    return ProblemError(f"{exc} (before the candidate ran: the problem itself fails)")


def _as_candidate(candidate: Candidate | str | Path) -> Candidate:
    return candidate if isinstance(candidate, Candidate) else Candidate.from_file(candidate)


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
