"""The Ray executor: verdicts on a Ray cluster (``pip install 'kerneljudge[ray]'``).

Each job is built first by a Ray task on a CPU node (:func:`~kerneljudge.executors._ray_host.
build_job`), then judged by a judging actor (:class:`~kerneljudge.executors._ray_host.JudgeHost`):
one actor per GPU (``num_gpus``), plus ``cpu_actors`` CPU actors. An actor holds warm judges
per problem and judges one job at a time, so two timings never share a device. A dispatcher
thread in this process sends built jobs to idle actors and collects the answers.

Node loss: a job whose actor died is judged again once, on an actor of another node (a fresh
one is started when the cluster has room); its future is completed exactly once, and a late
answer of an earlier attempt is dropped. Actors on a node that the cluster reports dead are
replaced. Build tasks lost with their node are retried by Ray; a job whose build is lost for
good is built by its judging actor.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kerneljudge.candidate import Candidate
from kerneljudge.errors import KernelJudgeError
from kerneljudge.executors._ray_host import JudgeHost, build_job, exit_when_orphaned, own_tmp
from kerneljudge.executors.base import Executor, ExecutorStats, Job, JobError
from kerneljudge.verdict import Verdict
from kerneljudge.worker.host_tmp import sweep

__all__ = ["RayExecutor", "RayMissing"]

log = logging.getLogger(__name__)

#: Seconds between two reads of the cluster's live nodes and GPU count.
REFRESH_S = 1.0


class RayMissing(KernelJudgeError, ImportError):
    """Ray is not installed (``pip install 'kerneljudge[ray]'``)."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayMissing("the Ray executor needs Ray: install kerneljudge[ray]") from None
    return ray


@dataclass
class _Slot:
    """One judging actor's place: ``label`` (``cpu:N``/``cuda:N``) outlives its actors."""

    label: str
    kind: str  # "cpu" or "gpu"
    actor: Any = None
    state: str = "starting"  # starting -> idle <-> busy; dead
    node_id: str = ""
    pid: int = 0  # the actor's process on its node (0 until it is ready)
    arch: str = ""
    job_id: str = ""
    busy_s: float = 0.0


@dataclass
class _Pending:
    job: Job
    future: Future[Verdict]
    kind: str
    state: str = "queued"  # queued -> building -> built -> judging
    attempts: int = 0
    meta: dict[str, Any] | None = None
    blob: Any = None  # the build's ObjectRef (never fetched here)
    avoid: set[str] = field(default_factory=set)


class RayExecutor(Executor):
    """Judge jobs on a Ray cluster.

    Args:
        address: the cluster (``"auto"``, ``"ray://host:10001"``, a GCS address), or None: a
            new local one. A process already connected to Ray uses that connection (and
            ``address`` is not read); a connection made here is shut down by :meth:`close`.
        gpus_per_actor: GPUs each GPU actor holds (its judge uses the first).
        cpu_actors: CPU judging actors.
        gpu_actors: GPU judging actors (None: one per ``gpus_per_actor`` GPUs of the cluster,
            grown as GPU nodes join).
        cpu_per_actor: CPUs each judging actor holds (its judge runs 2-3 worker processes).
        build_cpus: CPUs each build task holds.
        build_resources: extra Ray resources of a build task (e.g. ``{"builder": 1}`` to keep
            builds on nodes that advertise it).
        max_builds: build tasks in flight at once.
        cache_dir: the build cache folder on every node (None: each job's
            ``options.cache_dir``, else the default ``~/.cache/kerneljudge``).
        shared_cache: ``cache_dir`` is one shared filesystem on every node: builds are not
            shipped to the judging actor (else the built cache entry travels through Ray's
            object store and the actor unpacks it into its node's cache).
        threads: torch threads of the judges' CPU workers (0: torch's default).
        max_judges: warm judges per actor (least recently used closed first).
        retries: how many times a job whose actor died is judged again.
        ray_init: extra keyword arguments of ``ray.init`` (a local cluster's ``num_cpus``,
            ``object_store_memory``, ...).

    Raises:
        RayMissing: Ray is not installed (an ``ImportError``).
    """

    def __init__(
        self,
        address: str | None = None,
        gpus_per_actor: float = 1,
        cpu_actors: int = 0,
        *,
        gpu_actors: int | None = None,
        cpu_per_actor: float = 1,
        build_cpus: float = 1,
        build_resources: dict[str, float] | None = None,
        max_builds: int = 8,
        cache_dir: str | None = None,
        shared_cache: bool = False,
        threads: int = 0,
        max_judges: int = 4,
        retries: int = 1,
        ray_init: dict[str, Any] | None = None,
    ) -> None:
        ray = self._ray = _import_ray()
        sweep()  # the temporary folders of this machine's judging actors killed outright
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(address=address, **(ray_init or {}))
        self._cache_dir, self._shared = cache_dir, shared_cache
        self._gpus_per_actor, self._cpu_per_actor = gpus_per_actor, cpu_per_actor
        self._gpu_target = gpu_actors
        self._max_builds, self._retries = max(1, max_builds), max(0, retries)
        self._host_args = (cache_dir, threads, max_judges)
        self._build = ray.remote(build_job).options(
            num_cpus=build_cpus, resources=build_resources or {}, num_returns=2, max_retries=3
        )
        self._actor_cls = ray.remote(_RayJudgeHost)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._jobs: dict[str, _Pending] = {}
        self._queue: deque[str] = deque()  # waiting for a build task
        self._built: dict[str, deque[str]] = {"cpu": deque(), "gpu": deque()}
        self._refs: dict[Any, tuple[str, Any, Any]] = {}  # ref -> (what, job_id/slot, token)
        self._slots: list[_Slot] = []
        self._done = self._failed = 0
        #: Answers dropped because their job was already answered (a late duplicate).
        self.dropped_answers = 0
        #: Judging actors replaced after their node or process died.
        self.replaced_actors = 0
        #: Jobs judged again after their actor died.
        self.retried_jobs = 0
        self._started = time.monotonic()
        self._closed = False
        self._next_refresh = 0.0
        for i in range(max(0, cpu_actors)):
            self._slots.append(_Slot(f"cpu:{i}", "cpu"))
        self._refresh()
        self._thread = threading.Thread(target=self._loop, name="ray-executor", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the interface
    def submit(self, job: Job) -> Future[Verdict]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the executor is closed")
            pending = self._jobs.get(job.job_id)
            if pending is not None:
                return pending.future
            future: Future[Verdict] = Future()
            self._jobs[job.job_id] = _Pending(job, future, _kind(job))
            self._queue.append(job.job_id)
        self._wake.set()
        return future

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            pending = self._jobs.get(job_id)
            if pending is None or pending.state == "judging":
                return False
            self._finish(job_id, error=JobError("the job was cancelled", "cancelled"))
            return True

    def stats(self) -> ExecutorStats:
        with self._lock:
            uptime = time.monotonic() - self._started
            states = [p.state for p in self._jobs.values()]
            busy: dict[str, float] = {}
            for slot in self._slots:
                busy[slot.label] = min(1.0, slot.busy_s / uptime) if uptime > 0 else 0.0
            return ExecutorStats(
                queued=sum(s in ("queued", "built") for s in states),
                running=sum(s in ("building", "judging") for s in states),
                done=self._done,
                failed=self._failed,
                busy_share=busy,
                uptime_s=uptime,
            )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for job_id in list(self._jobs):
                self._finish(job_id, error=JobError("the executor was closed", "cancelled"))
        self._wake.set()
        self._thread.join(timeout=30)
        ray = self._ray
        for ref, (what, _, _) in list(self._refs.items()):
            if what == "build":
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        idle = [s.actor for s in self._slots if s.actor is not None and s.state == "idle"]
        # idle actors close their judges (their workers end) and remove their temporary folders
        with contextlib.suppress(Exception):
            ray.wait([a.shutdown.remote() for a in idle], num_returns=len(idle), timeout=20)
        killed = [s.actor for s in self._slots if s.actor is not None]
        for slot in self._slots:
            self._kill(slot)
        self._refs.clear()
        with contextlib.suppress(Exception):  # a killed actor's call fails once it has ended
            ray.wait([a.ready.remote() for a in killed], num_returns=len(killed), timeout=60)
        sweep()  # the temporary folders of the actors killed busy, where on this machine
        if self._own_ray:
            ray.shutdown()

    # ------------------------------------------------------------------ the dispatcher
    def _loop(self) -> None:
        """The dispatcher thread: :meth:`_step` until the executor closes; a failure of one
        step is logged and the loop goes on (the thread never dies with jobs pending)."""
        while True:
            try:
                if self._step():
                    return
            except Exception:  # noqa: BLE001
                log.exception("the Ray executor's dispatcher failed a step")
                time.sleep(0.1)

    def _step(self) -> bool:
        """One pass of the dispatcher; True when the executor is closed."""
        ray = self._ray
        with self._lock:
            if self._closed:
                return True
            self._schedule()
            refs = list(self._refs)
        if not refs:
            self._wake.wait(0.2)
            self._wake.clear()
            return False
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.1, fetch_local=False)
        except Exception:  # noqa: BLE001 - the cluster is unreachable for now
            time.sleep(0.1)
            return False
        for ref in ready:
            with self._lock:
                entry = self._refs.pop(ref, None)
            if entry is not None and not self._closed:
                self._answer(ref, *entry)
        return False

    def _schedule(self) -> None:
        """Under the lock: read the cluster, start builds, hand built jobs to idle actors."""
        if time.monotonic() >= self._next_refresh:
            self._refresh()
        building = sum(p.state == "building" for p in self._jobs.values())
        while self._queue and building < self._max_builds:
            job_id = self._queue.popleft()
            pending = self._jobs.get(job_id)
            if pending is None or pending.state != "queued":
                continue
            arch = self._arch(pending.kind)
            meta, blob = self._build.remote(
                pending.job.to_dict(), self._cache_dir, arch or None, not self._shared
            )
            pending.state, pending.blob = "building", blob
            self._refs[meta] = ("build", job_id, None)
            building += 1
        for kind, built in self._built.items():
            if built and not any(s.kind == kind for s in self._slots):
                where = "GPU" if kind == "gpu" else "CPU judging actor (cpu_actors=0)"
                while built:
                    error = JobError(f"no {where} in the Ray cluster", "device")
                    self._finish(built.popleft(), error=error)
            idle = [s for s in self._slots if s.kind == kind and s.state == "idle"]
            while built and idle:
                job_id = built.popleft()
                pending = self._jobs.get(job_id)
                if pending is None or pending.state != "built":
                    continue
                others = [s for s in idle if s.node_id not in pending.avoid]
                slot = (others or idle)[0]
                idle.remove(slot)
                self._dispatch(pending, slot)

    def _dispatch(self, pending: _Pending, slot: _Slot) -> None:
        pending.state, pending.attempts = "judging", pending.attempts + 1
        slot.state, slot.job_id = "busy", pending.job.job_id
        token = (pending.job.job_id, pending.attempts, slot.actor)
        ref = slot.actor.judge.remote(pending.job.to_dict(), pending.meta, pending.blob)
        self._refs[ref] = ("judge", slot, token)

    def _answer(self, ref: Any, what: str, target: Any, token: Any) -> None:
        ray = self._ray
        try:
            value = ray.get(ref)
            error: BaseException | None = None
        except Exception as exc:  # the task, actor or node failed
            value, error = None, exc
        with self._lock:
            if what == "ready":
                self._on_ready(target, token, value, error)
            elif what == "build":
                self._on_built(target, value, error)
            else:
                self._on_judged(target, token, value, error)

    def _on_ready(self, slot: _Slot, actor: Any, info: Any, error: BaseException | None) -> None:
        if slot.state != "starting" or slot.actor is not actor:
            return
        if error is not None:
            self._replace(slot)
            return
        slot.state, slot.node_id, slot.arch = "idle", info["node_id"], info["arch"]
        slot.pid = int(info.get("pid") or 0)

    def _on_built(self, job_id: str, meta: Any, error: BaseException | None) -> None:
        pending = self._jobs.get(job_id)
        if pending is None or pending.state != "building":
            return
        if error is not None:  # lost for good: the judging actor builds it
            pending.blob = None
        pending.meta = meta if error is None else None
        pending.state = "built"
        self._built[pending.kind].append(job_id)

    def _on_judged(
        self, slot: _Slot, token: tuple[str, int, Any], answer: Any, error: BaseException | None
    ) -> None:
        job_id, attempt, actor = token
        pending = self._jobs.get(job_id)
        current = pending is not None and pending.state == "judging"
        current = current and pending is not None and pending.attempts == attempt
        if slot.actor is actor and slot.job_id == job_id and slot.state == "busy":
            slot.state, slot.job_id = "idle", ""
        if error is not None:
            if slot.actor is actor:
                self._lost(slot, error)
            if current and pending is not None:
                self._retry(pending, slot.node_id, error)
            return
        slot.busy_s += float(answer.get("busy_s", 0.0))
        if not current:
            self.dropped_answers += 1
            return
        try:
            if "verdict" in answer:
                self._finish(job_id, verdict=Verdict.from_dict(answer["verdict"]))
            else:
                kind = str(answer.get("kind", "harness"))
                self._finish(job_id, error=JobError(str(answer["error"]), kind))
        except Exception as exc:  # noqa: BLE001 - an unreadable answer (version skew, ...)
            message = f"the actor's answer could not be read: {type(exc).__name__}: {exc}"
            self._finish(job_id, error=JobError(message.splitlines()[0][:300]))

    def _lost(self, slot: _Slot, error: BaseException) -> None:
        """An actor call failed: a dead actor is replaced, and the other actors of its node
        are asked again whether they live before they get a job."""
        if not isinstance(error, self._ray.exceptions.RayActorError):
            return
        node = slot.node_id
        self._replace(slot)
        for other in self._slots:
            if other is not slot and other.node_id == node and other.state == "idle":
                self._ping(other)

    def _retry(self, pending: _Pending, node: str, error: BaseException) -> None:
        if pending.attempts > self._retries:
            why = str(error).strip().splitlines()[0] if str(error).strip() else ""
            msg = f"the judging actor failed {pending.attempts} times ({type(error).__name__})"
            self._finish(pending.job.job_id, error=JobError(f"{msg}: {why}"[:300], "harness"))
            return
        if not isinstance(error, self._ray.exceptions.RayActorError):
            pending.meta = pending.blob = None  # the build may be what was lost: rebuild there
        pending.avoid.add(node)
        pending.state = "built"
        self.retried_jobs += 1
        self._built[pending.kind].appendleft(pending.job.job_id)

    def _finish(
        self, job_id: str, verdict: Verdict | None = None, error: JobError | None = None
    ) -> None:
        """Complete ``job_id``'s future, once: the job leaves every table here."""
        pending = self._jobs.pop(job_id, None)
        if pending is None or pending.future.done():
            return
        if verdict is not None:
            self._done += 1
            pending.future.set_result(verdict)
        else:
            self._failed += error is not None and error.kind != "cancelled"
            pending.future.set_exception(error or JobError("no answer"))

    # ------------------------------------------------------------------ actors
    def _refresh(self) -> None:
        """Read the live nodes (actors on dead ones are replaced) and the GPU count (GPU
        actors are added up to one per ``gpus_per_actor`` GPUs)."""
        ray = self._ray
        self._next_refresh = time.monotonic() + REFRESH_S
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            gpus = float(ray.cluster_resources().get("GPU", 0))
        except Exception:
            return
        for slot in self._slots:
            if slot.node_id and slot.node_id not in alive and slot.state in ("idle", "starting"):
                self._replace(slot)
        target = self._gpu_target
        if target is None and self._gpus_per_actor > 0:
            target = int(gpus // self._gpus_per_actor)
        have = sum(s.kind == "gpu" for s in self._slots)
        for i in range(have, target or 0):
            self._slots.append(_Slot(f"cuda:{i}", "gpu"))
        for slot in self._slots:
            if slot.actor is None and slot.state != "dead":
                self._start(slot)

    def _start(self, slot: _Slot) -> None:
        gpu = slot.kind == "gpu"
        device = "cuda:0" if gpu else "cpu"
        slot.actor = self._actor_cls.options(
            num_cpus=self._cpu_per_actor,
            num_gpus=self._gpus_per_actor if gpu else 0,
            scheduling_strategy="SPREAD",
            max_restarts=0,
            max_task_retries=0,
        ).remote(device, *self._host_args)
        slot.state, slot.node_id, slot.job_id, slot.pid = "starting", "", "", 0
        self._refs[slot.actor.ready.remote()] = ("ready", slot, slot.actor)

    def _ping(self, slot: _Slot) -> None:
        slot.state = "starting"
        self._refs[slot.actor.ready.remote()] = ("ready", slot, slot.actor)

    def _replace(self, slot: _Slot) -> None:
        """End ``slot``'s actor (dead or not) and start a new one; a job it was judging is
        answered by that call's failure."""
        self._kill(slot)
        self.replaced_actors += 1
        if not self._closed:
            self._start(slot)

    def _kill(self, slot: _Slot) -> None:
        if slot.actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(slot.actor, no_restart=True)
        slot.actor, slot.state = None, "dead" if self._closed else "starting"

    def _arch(self, kind: str) -> str:
        """The arch the ready actors of ``kind`` build for (the most common one); "" when
        none is ready yet (the build task then uses its own node's)."""
        archs = [s.arch for s in self._slots if s.kind == kind and s.arch]
        return max(set(archs), key=archs.count) if archs else ""


class _RayJudgeHost(JudgeHost):
    """:class:`JudgeHost` as a Ray actor: its :meth:`ready` names its node, it has a temporary
    folder of its own (:func:`own_tmp`), and it exits when its parent (the node's raylet, which
    started it) dies (:func:`exit_when_orphaned`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.tmp = own_tmp()
        super().__init__(*args, **kwargs)
        exit_when_orphaned()

    def ready(self) -> dict[str, Any]:
        import ray

        info = super().ready()
        info["node_id"] = ray.get_runtime_context().get_node_id()
        return info


def _kind(job: Job) -> str:
    """``gpu`` or ``cpu``: which actors judge ``job`` (``auto``: the candidate's backend)."""
    device = job.options.device
    if device == "auto":
        try:
            return "gpu" if Candidate.from_source(job.source).needs_gpu else "cpu"
        except KernelJudgeError:
            return "cpu"  # the judging actor's judge says what is wrong
    return "gpu" if device.startswith("cuda") else "cpu"
