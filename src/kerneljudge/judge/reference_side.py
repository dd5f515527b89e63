"""The reference's side of a verdict: its workers, and its trials prepared on a thread.

The reference's part of a verdict (its worker's start, its outputs and float64 oracle on every
trial's inputs, the ``torch.compile`` of the baseline) runs on a helper thread
(:class:`Preparation`) while the candidate builds, so a cold verdict costs little more than its
build; after a verdict, the next one's is prepared ahead with a fresh secret seed
(:meth:`ReferenceSide.prepare_ahead`). :class:`ReferenceSide` holds the reference sessions
(:class:`~kerneljudge.check.reference.ReferenceSession`, one per device and shape set) and the
latest preparation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import tempfile
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kerneljudge.check.limits import REFERENCE_S_PER_GIB, RunLimits, SetLimits, tensor_bytes
from kerneljudge.check.reference import (
    COMPILE_TIMEOUT_S,
    HeldTrial,
    ReferenceFailed,
    ReferenceSession,
)
from kerneljudge.errors import ProblemError, WorkerError
from kerneljudge.judge.config import JudgeConfig
from kerneljudge.problem import Problem
from kerneljudge.worker import WorkerProcess

__all__ = [
    "Prepared",
    "Preparation",
    "ReferenceSide",
    "derive_seed",
    "preparation_key",
    "problem_failed",
    "reference_environment",
]

#: Shape set -> its trials, held in the reference worker, in the order they are checked.
Prepared = dict[str, list[HeldTrial]]


def reference_environment(cache_root: Path) -> dict[str, str]:
    """What the environment of a judge's reference workers adds to the supervisor's:
    ``TORCHINDUCTOR_CACHE_DIR`` set to ``<cache_root>/inductor`` and ``TRITON_CACHE_DIR`` to
    its ``triton`` folder, so that the ``torch.compile`` of the reference (the ``compile``
    baseline) finds what an earlier judge compiled; inductor's own default lies beneath the
    worker's temporary folder, which ends with the worker. The reference worker loads what it
    finds there, so they are set only where no candidate can write there: Landlock (ABI 3 or
    later, which also governs truncation) confines candidate workers, build workers and the
    header maker to their own folders (beneath ``<cache_root>/builds``, the header store, their
    scratch folders (``kj-*`` in the temporary folder, which in a judging host is its own
    folder in the base temporary folder, :mod:`kerneljudge.worker.host_tmp`: no host's folder
    and no ``kj-*`` folder there is taken), ``~/.triton``, ``~/.nv`` and
    ``CUDA_CACHE_PATH``, and the folders ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``
    name in the supervisor's environment, which candidates inherit), the folder is not a link,
    and it lies neither beneath one of them nor above one. Else nothing is added. (The
    supervisor's own values are not the reference's: candidates may write there, and inductor
    sets ``TORCHINDUCTOR_CACHE_DIR`` in any process that compiled once.) The supervisor's
    environment is read when this is called: a cache folder it names only later is not checked
    against (docs/security.md). The folder returned is protected from then on
    (:func:`kerneljudge.worker.confine.protect`): every confined process started later is
    refused a writable folder that resolves to it, above it or beneath it."""
    from kerneljudge.build.pch import store_dir
    from kerneljudge.worker.confine import features, protect
    from kerneljudge.worker.environment import candidates_cache_folders
    from kerneljudge.worker.host_tmp import PREFIXES, base_folder

    if features().landlock_abi < 3:
        return {}
    root = Path(cache_root).resolve()
    folder = root / "inductor"
    theirs = [root / "builds", store_dir(root), *map(Path, candidates_cache_folders())]
    if folder.is_symlink() or os.path.realpath(folder) != str(folder):
        return {}
    for t in (Path(os.path.realpath(t)) for t in theirs):
        if folder.is_relative_to(t) or t.is_relative_to(folder):
            return {}
    # Candidate workers' scratch folders: kj-* folders of the temporary folder, which is a
    # judging host's own folder in the base temporary folder (beside other hosts') or that one.
    scratch, base = Path(os.path.realpath(tempfile.gettempdir())), base_folder()
    if scratch.is_relative_to(folder) or (
        folder.is_relative_to(base)
        and folder.relative_to(base).parts[0].startswith(("kj-", *PREFIXES))
    ):
        return {}
    protect(folder)  # no confined process started from now on is given it (links included)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder), "TRITON_CACHE_DIR": str(folder / "triton")}


class _Dropped(Exception):
    """A preparation nobody needs any more, stopped before it started."""


class Preparation:
    """The reference's part of one verdict (:meth:`ReferenceSide.prepare`), on its own thread.

    Preparations run one at a time, in order (each first waits for the one before it: they
    share the reference workers). One made ahead of need waits for ``lock``, the device lock of
    everything timed on the same device, unless whoever needs it holds that lock already
    (:meth:`result`) or it was dropped.

    Attributes:
        key: what it depends on besides the seed (see :func:`preparation_key`).
        run_seed: the seed of its inputs.
        secret: the seed was drawn here, not given by the caller.
        dropped: nobody will use the result.
    """

    def __init__(
        self,
        key: tuple[Any, ...],
        run_seed: int,
        secret: bool,
        run: Callable[[], Prepared],
        after: Preparation | None,
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

    def _main(self, run: Callable[[], Prepared], after: Preparation | None, lock: Any) -> None:
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
            ReferenceFailed, WorkerError: as :meth:`ReferenceSide.prepare`.
        """
        self._lock_held_by_caller.set()
        return self._future.result()

    def done(self) -> bool:
        """Whether it has finished (with a result or an error)."""
        return self._future.done()

    def exception(self) -> BaseException | None:
        """Its error once finished (None: it succeeded); waits until it has finished."""
        return self._future.exception()

    def drop(self) -> None:
        """Nobody will use the result: skip the work if it has not started."""
        self.dropped = True
        self._lock_held_by_caller.set()

    def join(self) -> None:
        self._thread.join()


def preparation_key(config: JudgeConfig, device: str) -> tuple[Any, ...]:
    """What a reference preparation depends on, besides its run seed."""
    return (
        device,
        config.trials,
        config.shape_sets,
        config.tolerance,
        config.timing and "compile" in config.baselines,
        config.run_timeout_s,
    )


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed derived from ``seed`` and ``parts`` (SHA-256 of their text)."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def weight_seed_of(seed: int | None) -> int:
    """The seed of a judge's weights: derived from its configured ``seed`` (also the run seed of
    its verdicts, which must stay in the judge: the weights' seed reaches candidates' workers,
    :func:`derive_seed` with ``"weights"``), else a fresh secret one."""
    return secrets.randbits(62) if seed is None else derive_seed(seed, "weights")


def problem_failed(exc: ReferenceFailed) -> ProblemError:
    """A reference that failed before it ever ran to the end: the problem's own error."""
    return ProblemError(f"{exc} (before the candidate ran: the problem itself fails)")


class ReferenceSide:
    """The reference sessions of one judge and the latest preparation of a verdict's trials.

    Not thread-safe beyond what its preparation thread needs, like the judge.

    Args:
        problem: the problem whose reference runs.
        seed: the judge's configured seed (None: none); the weights both models get are drawn
            from :func:`weight_seed_of` it.
        threads: torch threads in the reference workers (0: torch's default).
        env: added to the reference workers' environment (:func:`reference_environment`).
    """

    def __init__(
        self, problem: Problem, seed: int | None, threads: int, env: dict[str, str] | None = None
    ) -> None:
        self.problem, self.weight_seed, self.threads = problem, weight_seed_of(seed), threads
        self.env = env
        #: The latest preparation; while one runs, the reference sessions are its.
        self.pending: Preparation | None = None
        self.closed = False
        self._sessions: dict[tuple[str, str], ReferenceSession] = {}
        self._lock = threading.Lock()
        #: Bytes each reference worker's kept trials may take before the trials left are
        #: deferred (0: its share of its device's memory; :meth:`prepare`).
        self.keep_bytes = 0
        #: Reference workers started before the problem was loaded (by the judge, beside the
        #: problem's probe), by device: the first session on that device takes its one.
        self.early: dict[str, WorkerProcess] = {}

    @property
    def sessions(self) -> Mapping[tuple[str, str], ReferenceSession]:
        """The live sessions by ``(device, shape set)`` (a read-only view)."""
        return MappingProxyType(self._sessions)

    def session(self, device: str, shape_set: str) -> ReferenceSession:
        """The reference session of ``shape_set`` on ``device``, started if there is none (a
        failed one is replaced, never reused).

        Raises:
            WorkerError: the judge was closed.
        """
        key = (device, shape_set)
        with self._lock:
            if self.closed:
                raise WorkerError("the judge was closed")
            if key in self._sessions and self._sessions[key].failed:
                self._sessions.pop(key).close()
            if key not in self._sessions:
                early = self.early.pop(device, None)
                try:
                    self._sessions[key] = ReferenceSession(
                        self.problem,
                        shape_set,
                        device,
                        self.weight_seed,
                        self.threads,
                        early,
                        self.env,
                    )
                except BaseException:
                    if early is not None:  # it has loaded nothing: kept for the next session
                        self.early[device] = early
                    raise
            return self._sessions[key]

    def claim(self, config: JudgeConfig, device: str, seed: int | None) -> tuple[int, bool, bool]:
        """The run seed of a verdict: ``(run_seed, secret, reused)``; ``reused``: the pending
        preparation (made ahead with a fresh secret seed, same key) is this verdict's. Any
        other pending one is dropped. A given seed (``seed``, else ``config.seed``) is never
        served by a secret preparation."""
        ahead = self.pending
        secret = seed is None and config.seed is None
        if (
            secret
            and ahead is not None
            and ahead.secret
            and not ahead.dropped
            and ahead.key == preparation_key(config, device)
        ):
            return ahead.run_seed, True, True
        if ahead is not None:
            ahead.drop()
        if seed is None:
            seed = config.seed if config.seed is not None else secrets.randbits(62)
        return seed, secret, False

    def begin(
        self, config: JudgeConfig, device: str, run_seed: int, secret: bool, lock: Any = None
    ) -> Preparation:
        """Start preparing a verdict's reference work (after the pending one) and make it the
        pending one; ``lock``: the device lock it waits for (None: none)."""
        run = functools.partial(self.prepare, config, device, run_seed)
        key = preparation_key(config, device)
        self.pending = Preparation(key, run_seed, secret, run, after=self.pending, lock=lock)
        return self.pending

    def prepare_ahead(self, config: JudgeConfig, device: str, lock: Any) -> None:
        """Prepare the reference for the next verdict now, with a fresh secret run seed, while
        nothing is timed (an agent's next call comes seconds later); :meth:`claim` gives it to
        the next verdict when its configuration and device match and no seed is asked for."""
        if config.seed is None and not self.closed:
            self.begin(config, device, secrets.randbits(62), True, lock=lock)

    def settle(self) -> None:
        """Drop the pending preparation and wait until none runs."""
        prep, self.pending = self.pending, None
        if prep is not None:
            prep.drop()
            prep.join()

    def finish_alone(self, device_lock: Any) -> None:
        """A verdict ends before the reference work it started: where the device is shared
        (``device_lock`` not None, held by the caller), that work must not go on after the
        caller lets the lock go, so it is waited for here. It stays usable by the next verdict:
        no candidate saw its inputs."""
        if device_lock is not None and self.pending is not None:
            self.pending.join()

    def take(self, config: JudgeConfig, device: str, run_seed: int) -> Prepared:
        """The pending preparation's result; prepared again once, with new reference workers,
        if a reference that had worked failed meanwhile. Called before the candidate's code
        runs, so such a failure is never this candidate's.

        Raises:
            ProblemError: the reference fails on its own.
            WorkerError: a reference worker failed otherwise, or the judge was closed.
        """
        prep, self.pending = self.pending, None
        assert prep is not None
        try:
            return prep.result()
        except ReferenceFailed as exc:
            if not exc.had_answered:
                raise problem_failed(exc) from None
        try:
            return self.prepare(config, device, run_seed)
        except ReferenceFailed as exc:  # fresh reference workers: the problem fails on its own
            raise problem_failed(exc) from None

    def prepare(self, config: JudgeConfig, device: str, run_seed: int) -> Prepared:
        """The reference's part of one verdict (runs on the preparation thread).

        For each shape set (the timed one last): the trials, run by the reference and held in
        its worker (inputs, outputs, float64 oracle outputs; :meth:`ReferenceSession.run_trial`)
        with its reply on them (input effects, layouts) and the wall time of each run, which
        the limits of the candidate's requests derive from
        (:meth:`kerneljudge.check.limits.RunLimits.for_set`; from the trials run here); once
        the worker says it has no room to keep another (within :attr:`keep_bytes`), the
        trials left are deferred (:attr:`HeldTrial.deferred`: run when compared), so that what
        it keeps stays bounded; then the ``torch.compile`` baseline is compiled if it will be
        timed. Nothing is measured before these runs, so
        their limit follows the bytes they move
        (:meth:`~kerneljudge.check.limits.RunLimits.reference_s`, at least the configured
        ``run_timeout_s``).

        Raises:
            ReferenceFailed: the reference failed.
        """
        limits = RunLimits(config.run_timeout_s)
        floor_s = limits.reference_s(0)
        prepared: Prepared = {}
        sets = config.ordered_shape_sets()
        for shape_set in sets:
            ref = self.session(device, shape_set)
            ref.forget(floor_s)  # what an earlier verdict left there
            ref.keep_bytes = self.keep_bytes
            oracle = config.tolerance == "oracle"
            held: list[HeldTrial] = []
            for i in range(config.trials):
                seed = derive_seed(run_seed, shape_set, i)
                if held and (held[-1].deferred or not held[-1].reply.get("room", True)):
                    held.append(HeldTrial(str(i), seed, {"oracle": oracle}, deferred=True))
                    continue
                held.append(
                    ref.run_trial(i, seed, floor_s, oracle=oracle, per_gib_s=REFERENCE_S_PER_GIB)
                )
            prepared[shape_set] = held
        if config.timing and "compile" in config.baselines:
            held = prepared[sets[-1]]
            replay_s = limits.reference_s(max((h.input_bytes for h in held), default=0))
            self.session(device, sets[-1]).ensure_compiled(
                max(replay_s, COMPILE_TIMEOUT_S), (), replay_s
            )
        return prepared

    def limits(self, config: JudgeConfig, device: str, prepared: Prepared) -> dict[str, SetLimits]:
        """The limits of each shape set's requests in the verdict ``prepared`` is for
        (:meth:`kerneljudge.check.limits.RunLimits.for_set`): from the wall times of the
        reference's trial runs, the bytes moved being a trial's inputs and outputs at most
        and the weights (``init_inputs`` and the state dict, sent in a ``setup``)."""
        rule = RunLimits(config.run_timeout_s)
        limits = {}
        for shape_set, held in prepared.items():
            ref = self.session(device, shape_set)
            weights = tensor_bytes(ref.init_inputs) + ref.weight_bytes
            moved = max((h.input_bytes + h.output_bytes for h in held), default=0)
            ran = [h for h in held if not h.deferred]
            calls = [h.call_s or h.wall_s for h in ran]  # the call itself where reported
            limits[shape_set] = rule.for_set(calls, moved + weights)
        return limits

    def close(self) -> None:
        """Stop: no session starts after this, a running preparation fails at once (its
        workers are killed) and is waited for, and every session ends."""
        with self._lock:
            self.closed = True
            early, self.early = list(self.early.values()), {}
        for worker in early:
            worker.close()
        if self.pending is not None:
            self.pending.drop()
        with self._lock:
            running = list(self._sessions.values())
        for ref in running:
            ref.kill()
        self.settle()
        for ref in list(self._sessions.values()):
            ref.close()
        self._sessions.clear()
