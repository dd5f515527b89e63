"""The local executor: this machine's GPUs and CPU cores, one judging process per slot.

Slots: one per GPU (``cuda:N``) and a number of CPU slots (``cpu:0``, ``cpu:1``, ...). Each
slot is a long-lived process (:mod:`kerneljudge.executors.slot`) that judges one job at a time,
so timings never overlap on a device, and hosts warm judges. The CPU cores this process may
use are split into disjoint, equal, contiguous sets, one per slot (GPU slots first); a slot
and every process it starts run on its own set only, so two slots' timings never share a core.

A job goes: routing (which kind of slot, at :meth:`LocalExecutor.submit`) -> a build thread
(:func:`kerneljudge.build.build` into the job's build cache, for the arch the slot's judge
builds for: the same cache entry the judge then finds) -> the first free slot it may run on,
one whose judge for the job's problem is warm first -> a verdict, or a :class:`JobError`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneljudge.build import BuildCache, build
from kerneljudge.candidate import Candidate
from kerneljudge.errors import KernelJudgeError
from kerneljudge.executors._cores import core_sets, cuda_name, default_cpu_slots
from kerneljudge.executors._process import SlotDied, SlotProcess
from kerneljudge.executors.base import Executor, ExecutorStats, Job, JobError
from kerneljudge.verdict import Verdict
from kerneljudge.worker.host_tmp import EXECUTOR, HostTmp
from kerneljudge.worker.sandbox import child_pids

__all__ = ["LocalExecutor", "core_sets", "default_cpu_slots"]

log = logging.getLogger(__name__)

#: Attempts of one job when its slot process dies under it (the first and one retry).
ATTEMPTS = 2
#: Seconds a slot process may take to start (import torch, create the device's context).
START_TIMEOUT_S = 300.0


@dataclass(eq=False)
class _Entry:
    """A job in the executor: queued -> building -> ready -> running -> done."""

    job: Job
    future: Future[Verdict]
    cand: Candidate
    kind: str  # "cpu" or "cuda"
    pinned: str | None  # "cuda:N" when the job names its GPU
    state: str = "queued"
    handed_build: dict[str, Any] | None = None
    attempts: int = 0

    @property
    def warm_key(self) -> tuple[str, str]:
        return (self.job.problem, self.job.options.cache_dir or "")


@dataclass(eq=False)
class _Slot:
    name: str  # "cpu:0", "cuda:1"
    device: str  # "cpu" or "cuda:N"
    cores: tuple[int, ...]
    kind: str
    proc: SlotProcess | None = None
    arch: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    start_error: str = ""
    warm: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    idle: bool = False
    busy_s: float = 0.0
    busy_since: float | None = None
    thread: threading.Thread | None = None
    restarts: int = 0
    starting: SlotProcess | None = None
    current: _Entry | None = None

    def takes(self, entry: _Entry) -> bool:
        return self.kind == entry.kind and entry.pinned in (None, self.device)


class LocalExecutor(Executor):
    """Judges jobs on this machine's GPUs and CPU cores (see the module doc).

    Args:
        devices: the GPUs to judge on (``["cuda:0", "cuda:1"]``); None: every visible GPU.
        cpu_slots: CPU slots (None: :func:`default_cpu_slots`; 0: none).
        judges_per_slot: warm judges a slot keeps (one per problem and build cache; the least
            recently used is closed first).
        build_threads: builds run at once (None: this process's CPU cores).
        job_timeout_s: seconds one job may hold a slot before the slot is killed (a harness
            that hangs; the candidate's own hangs end by ``run_timeout_s`` in its verdict).

    Raises:
        ValueError: fewer CPU cores than slots; a device that is not ``cuda:N``, or not one
            of the visible GPUs.
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        cpu_slots: int | None = None,
        judges_per_slot: int = 4,
        build_threads: int | None = None,
        job_timeout_s: float = 3600.0,
    ) -> None:
        import torch

        visible = torch.cuda.device_count()
        if devices is None:
            devices = [f"cuda:{i}" for i in range(visible)]
        gpus = [cuda_name(d) for d in devices]
        for gpu in gpus:
            if int(gpu.partition(":")[2]) >= visible:
                raise ValueError(f"{gpu} is not a GPU this process sees ({visible} visible)")
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"a device is named twice: {list(devices)}")
        n_cpu = default_cpu_slots(len(gpus)) if cpu_slots is None else cpu_slots
        if n_cpu < 0:
            raise ValueError("cpu_slots must be >= 0")
        sets = core_sets(len(gpus) + n_cpu)
        self._slots = [_Slot(g, g, sets[i], "cuda") for i, g in enumerate(gpus)]
        self._slots += [_Slot(f"cpu:{i}", "cpu", sets[len(gpus) + i], "cpu") for i in range(n_cpu)]
        self.judges_per_slot = max(1, judges_per_slot)
        self.job_timeout_s = job_timeout_s
        self._cond = threading.Condition()
        self._pending: dict[str, _Entry] = {}
        self._ready: list[_Entry] = []
        self._building: set[Path] = set()  # cache entries being built by this executor
        self._closed = False
        self._done = self._failed = 0
        self._started = time.monotonic()
        self._own_tmp = HostTmp.make(EXECUTOR)  # the slots' logs; sweeps the dead hosts' first
        self._log_dir = self._own_tmp.path
        cores = len(os.sched_getaffinity(0))
        self._builds = ThreadPoolExecutor(build_threads or cores, thread_name_prefix="kj-build")
        for slot in self._slots:
            slot.thread = threading.Thread(
                target=self._run_slot, args=(slot,), name=f"kj-slot-{slot.name}", daemon=True
            )
            slot.thread.start()

    # ------------------------------------------------------------------ public
    @property
    def slots(self) -> list[str]:
        """The slots' names (``cuda:N`` GPU slots, then ``cpu:N``)."""
        return [s.name for s in self._slots]

    def slot_cores(self) -> dict[str, tuple[int, ...]]:
        """Each slot's CPU cores."""
        return {s.name: s.cores for s in self._slots}

    def slot_pids(self) -> dict[str, int | None]:
        """Each slot's process id now (None while it is being started)."""
        return {s.name: (s.proc.pid if s.proc else None) for s in self._slots}

    def slot_jobs(self) -> dict[str, str | None]:
        """The job id each slot is judging now (None: idle or starting)."""
        with self._cond:
            return {s.name: (s.current.job.job_id if s.current else None) for s in self._slots}

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every slot's process has started (or failed to).

        Raises:
            TimeoutError: some slot did not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        for slot in self._slots:
            if not slot.started.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"slot {slot.name} did not start within {timeout_s:.0f} s")

    def submit(self, job: Job) -> Future[Verdict]:
        with self._cond:
            if self._closed:
                raise RuntimeError("the executor is closed")
            if job.job_id in self._pending:
                return self._pending[job.job_id].future
            future: Future[Verdict] = Future()
            future.set_running_or_notify_cancel()  # only cancel() ends it early
            try:
                entry = self._route(job, future)
            except JobError as exc:
                future.set_exception(exc)
                self._failed += 1
                return future
            self._pending[job.job_id] = entry
        try:
            self._builds.submit(self._build, entry)
        except RuntimeError:  # closed meanwhile: close() has cancelled the job
            pass
        return future

    def cancel(self, job_id: str) -> bool:
        with self._cond:
            entry = self._pending.get(job_id)
            if entry is None or entry.state not in ("queued", "building", "ready"):
                return False
            if entry in self._ready:
                self._ready.remove(entry)
            self._finish(entry, JobError("the job was cancelled", kind="cancelled"))
            return True

    def stats(self) -> ExecutorStats:
        with self._cond:
            now = time.monotonic()
            uptime = now - self._started
            states = [e.state for e in self._pending.values()]
            busy = {}
            for s in self._slots:
                held = s.busy_s + (now - s.busy_since if s.busy_since is not None else 0.0)
                busy[s.name] = min(1.0, held / uptime) if uptime > 0 else 0.0
            return ExecutorStats(
                queued=sum(st in ("queued", "ready") for st in states),
                running=sum(st in ("building", "running") for st in states),
                done=self._done,
                failed=self._failed,
                busy_share=busy,
                uptime_s=uptime,
            )

    def close(self) -> None:
        """Stop accepting jobs; pending jobs end in :class:`JobError` (``cancelled``); builds
        in progress are killed; every slot process ends (an idle one closes its judges first,
        a busy one is killed with its process group). Returns when no process of the
        executor's is left, and its slots' temporary folders and its own are removed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for entry in list(self._pending.values()):
                self._finish(entry, JobError("the executor was closed", kind="cancelled"))
            self._ready.clear()
            self._cond.notify_all()
            busy = [s.proc for s in self._slots if s.proc is not None and not s.idle]
            busy += [s.starting for s in self._slots if s.starting is not None]
        for proc in busy:
            proc.kill()
        self._builds.shutdown(wait=False, cancel_futures=True)
        self._kill_builds()
        self._builds.shutdown(wait=True)
        for slot in self._slots:
            if slot.thread is not None:
                slot.thread.join()
        self._own_tmp.remove()

    # ------------------------------------------------------------------ routing and builds
    def _route(self, job: Job, future: Future[Verdict]) -> _Entry:
        """The job's entry, routed; raises its JobError when it cannot be judged here."""
        try:
            job.options.judge_config()
        except (KernelJudgeError, ValueError) as exc:  # an unknown device is a device error
            kind = "device" if getattr(exc, "field", "") == "device" else "harness"
            raise JobError(_one_line(exc), kind=kind) from None
        try:
            cand = Candidate.from_source(job.source, name=job.name)
        except KernelJudgeError as exc:
            raise JobError(_one_line(exc), kind="candidate") from None
        requested = job.options.device
        pinned = None
        if requested == "auto":
            kind = "cuda" if cand.needs_gpu else "cpu"
        elif requested == "cpu":
            if cand.needs_gpu:
                message = f"this candidate's backend ({cand.backend}) runs on a CUDA GPU"
                raise JobError(message + "; use device cuda", kind="device")
            kind = "cpu"
        else:
            try:
                pinned = cuda_name(requested) if requested != "cuda" else None
            except ValueError as exc:
                raise JobError(str(exc), kind="device") from None
            kind = "cuda"
        entry = _Entry(job, future, cand, kind, pinned)
        if not any(s.takes(entry) for s in self._slots):
            have = ", ".join(self.slots) or "none"
            want = pinned or ("a CUDA GPU" if kind == "cuda" else "a CPU slot")
            raise JobError(f"no slot for {want} on this executor (slots: {have})", kind="device")
        return entry

    def _build(self, entry: _Entry) -> None:
        """Build thread: build the candidate for every arch its slots build for, then queue
        it. A failed build is the judge's own verdict (the slot's judge finds it cached)."""
        with self._cond:
            if entry.state != "queued":
                return
            entry.state = "building"
        try:
            options = entry.job.options
            cache = BuildCache(options.cache_dir)
            for arch in self._archs(entry):
                key_dir = cache.entry(cache.key(entry.cand, arch))
                with self._cond:
                    self._building.add(key_dir)
                try:
                    result = build(
                        entry.cand, cache=cache, arch=arch, timeout_s=options.build_timeout_s
                    )
                finally:
                    with self._cond:
                        self._building.discard(key_dir)
                if result.timed_out:  # not cached: the slot's judge gets this result
                    entry.handed_build = dataclasses.asdict(result)
        except Exception:  # noqa: BLE001 - the slot's judge builds and says what went wrong
            log.warning("build ahead of job %s failed", entry.job.job_id, exc_info=True)
        with self._cond:
            if entry.state == "building":
                entry.state = "ready"
                self._ready.append(entry)
                self._cond.notify_all()

    def _archs(self, entry: _Entry) -> list[str]:
        """The archs the slots that may take ``entry`` build for (waits for their start)."""
        archs: list[str] = []
        for slot in self._slots:
            if slot.takes(entry):
                slot.started.wait(START_TIMEOUT_S)
                if slot.arch and slot.arch not in archs:
                    archs.append(slot.arch)
        return archs

    def _kill_builds(self) -> None:
        """SIGKILL the build processes of this executor's builds in progress (found among this
        process's descendants by the cache entry on their command line)."""
        with self._cond:
            entries = [str(p) for p in self._building]
        if not entries:
            return
        for pid in child_pids(os.getpid()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(e in cmdline for e in entries):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # ------------------------------------------------------------------ slots
    def _run_slot(self, slot: _Slot) -> None:
        """A slot's thread: keep its process up, take jobs, judge them."""
        while True:
            with self._cond:
                if self._closed:
                    break
            if slot.proc is None:
                self._start(slot)
            entry = self._take(slot)
            if entry is None:
                break
            if slot.proc is None:
                self._settle(entry, JobError(slot.start_error, kind="harness"))
                continue
            self._judge_on(slot, entry)
        if slot.proc is not None:
            slot.proc.close()
            slot.proc = None

    def _start(self, slot: _Slot) -> None:
        proc = None
        try:
            proc = SlotProcess(
                slot.device, slot.cores, self.judges_per_slot, self._log_dir / f"{slot.name}.log"
            )
            with self._cond:
                slot.starting = proc
                if self._closed:
                    proc.kill()
            hello = proc.wait_ready(START_TIMEOUT_S)
            slot.proc, slot.arch, slot.start_error = proc, str(hello.get("arch") or ""), ""
        except (SlotDied, OSError) as exc:
            if proc is not None:
                proc.close(0.0)
            slot.start_error = f"the judging process for {slot.name} did not start: {exc}"
            log.warning(slot.start_error)
        with self._cond:
            slot.starting = None
        slot.warm.clear()
        slot.started.set()

    def _take(self, slot: _Slot) -> _Entry | None:
        """The next ready job this slot may run (FIFO; a job whose judge is warm on another
        idle slot is left to that slot); None once the executor is closed."""
        with self._cond:
            slot.idle = True
            try:
                while not self._closed:
                    for entry in self._ready:
                        if slot.takes(entry) and not self._warm_elsewhere(slot, entry):
                            self._ready.remove(entry)
                            entry.state = "running"
                            slot.current = entry
                            slot.busy_since = time.monotonic()
                            # A job left to this slot as the warm one goes to another now.
                            self._cond.notify_all()
                            return entry
                    self._cond.wait()
                return None
            finally:
                slot.idle = False

    def _warm_elsewhere(self, slot: _Slot, entry: _Entry) -> bool:
        key = entry.warm_key
        if key in slot.warm:
            return False
        return any(
            o is not slot and o.idle and o.proc is not None and o.takes(entry) and key in o.warm
            for o in self._slots
        )

    def _judge_on(self, slot: _Slot, entry: _Entry) -> None:
        assert slot.proc is not None
        entry.attempts += 1
        message = {"op": "judge", "job": entry.job.to_dict(), "build": entry.handed_build}
        try:
            slot.proc.send(message)
            reply = slot.proc.recv(self.job_timeout_s)
        except SlotDied as exc:
            self._slot_died(slot, entry, str(exc))
            return
        finally:
            self._idle(slot)
        key = entry.warm_key
        if reply.get("op") == "verdict":
            try:
                result: Verdict | JobError = Verdict.from_dict(reply["verdict"])
            except (KeyError, ValueError, TypeError) as exc:
                result = JobError(f"unreadable verdict from the slot: {exc}", kind="harness")
            slot.warm[key] = None
            slot.warm.move_to_end(key)
            while len(slot.warm) > self.judges_per_slot:
                slot.warm.popitem(last=False)
        else:
            kind = str(reply.get("kind") or "harness")
            result = JobError(str(reply.get("message") or "the job failed"), kind=kind)
            slot.warm.pop(key, None)  # the slot threw that judge away
        self._settle(entry, result)

    def _slot_died(self, slot: _Slot, entry: _Entry, how: str) -> None:
        """The slot's process ended under ``entry``: it is replaced (by the slot's thread, on
        its next turn) and the job retried once, then failed."""
        assert slot.proc is not None
        slot.proc.close(0.0)
        slot.proc = None
        slot.restarts += 1
        with self._cond:
            if self._closed:
                return
            if entry.attempts < ATTEMPTS and not entry.future.done():
                entry.state = "ready"
                self._ready.insert(0, entry)
                self._cond.notify_all()
                return
        message = f"{how} while judging this job, {entry.attempts} times"
        self._settle(entry, JobError(message, kind="harness"))

    def _idle(self, slot: _Slot) -> None:
        with self._cond:
            slot.current = None
            if slot.busy_since is not None:
                slot.busy_s += time.monotonic() - slot.busy_since
                slot.busy_since = None

    def _settle(self, entry: _Entry, result: Verdict | JobError) -> None:
        with self._cond:
            self._finish(entry, result)

    def _finish(self, entry: _Entry, result: Verdict | JobError) -> None:
        """Give ``entry`` its result (once; the caller holds the lock)."""
        if entry.state == "done":
            return
        entry.state = "done"
        if self._pending.get(entry.job.job_id) is entry:
            del self._pending[entry.job.job_id]
        try:
            if isinstance(result, JobError):
                entry.future.set_exception(result)
                self._failed += 1
            else:
                entry.future.set_result(result)
                self._done += 1
        except InvalidStateError:
            pass


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
