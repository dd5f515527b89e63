"""What runs on a Ray cluster's nodes for :class:`~kerneljudge.executors.ray_executor.RayExecutor`:
the build step (a cache entry built and packed on a CPU node) and the judging host (warm
:class:`~kerneljudge.judge.Judge` objects per problem, one job at a time).

Nothing here imports Ray: the executor wraps :func:`build_job` as a Ray task and
:class:`JudgeHost` as a Ray actor. Payloads are plain dicts (JSON-ready):

* a build's ``meta``: ``{"key", "arch", "ok", "error"}``; its ``blob``: the packed cache entry
  (``bytes``, a gzip'd tar, see :func:`pack_entry`) or None;
* a judging answer: ``{"verdict": Verdict.to_dict()}`` or ``{"error": one line, "kind":
  JobError kind}``, with ``"busy_s"`` (seconds the host spent on the job).
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from kerneljudge.build import BuildCache, build
from kerneljudge.candidate import Candidate
from kerneljudge.device import build_arch
from kerneljudge.executors._warm import WarmJudges, one_line
from kerneljudge.executors.base import Job, error_kind
from kerneljudge.judge import JudgeConfig
from kerneljudge.worker.host_tmp import ACTOR, HostTmp

__all__ = [
    "JudgeHost",
    "build_job",
    "error_kind",
    "exit_when_orphaned",
    "install_entry",
    "job_config",
    "own_tmp",
    "pack_entry",
]

#: The file whose presence makes a cache entry complete (written last by :func:`install_entry`).
_RESULT_FILE = "build-result.json"


def job_config(job: Job, device: str, cache_dir: str | None, threads: int) -> JudgeConfig:
    """The :class:`JudgeConfig` of ``job`` judged on ``device`` with the host's cache folder
    (``cache_dir``; None: the job's own ``options.cache_dir``, else the default) and ``threads``.

    Raises:
        ConfigError: an option out of its range.
    """
    config = job.options.judge_config()
    cache = cache_dir or job.options.cache_dir
    return JudgeConfig(
        **{
            **{f: getattr(config, f) for f in config.__dataclass_fields__},
            "device": device,
            "cache_dir": Path(cache) if cache else None,
            "threads": threads,
        }
    )


# ---------------------------------------------------------------- build step (CPU nodes)
def pack_entry(cache: BuildCache, key: str) -> bytes | None:
    """The cache entry ``key`` as a gzip'd tar (its lock files left out); None when the entry
    holds no stored result (a build that timed out is not stored)."""
    entry = cache.entry(key)
    if not (entry / _RESULT_FILE).is_file():
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(entry.rglob("*")):
            if path.name in (".lock", "lock") or path.suffix == ".tmp":
                continue
            tar.add(path, arcname=str(path.relative_to(entry)), recursive=False)
    return buf.getvalue()


def install_entry(cache: BuildCache, key: str, blob: bytes) -> bool:
    """Unpack :func:`pack_entry`'s ``blob`` as the cache entry ``key`` of ``cache``, unless the
    entry is already complete. Under the entry's lock; the stored result is written last, so a
    half-unpacked entry is never read as a build. Members that would land outside the entry
    (absolute paths, ``..``, links out) are refused by tarfile's ``data`` filter.

    Returns True when it unpacked, False when the entry was there already.

    Raises:
        tarfile.TarError, OSError: the blob is not a readable entry.
    """
    with cache.locked(key) as entry:
        if (entry / _RESULT_FILE).is_file():
            return False
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            members = tar.getmembers()
            rest = [m for m in members if m.name != _RESULT_FILE]
            last = [m for m in members if m.name == _RESULT_FILE]
            tar.extractall(entry, members=rest, filter="data")
            tar.extractall(entry, members=last, filter="data")
        return True


def build_job(
    job_data: dict[str, Any], cache_dir: str | None, arch: str | None, ship: bool
) -> tuple[dict[str, Any], bytes | None]:
    """Build ``job_data``'s candidate (a :meth:`Job.to_dict`) into the build cache of this node.

    Args:
        job_data: the job.
        cache_dir: the build cache folder (None: the job's ``options.cache_dir``, else
            :func:`kerneljudge.build.default_cache_dir`).
        arch: the CUDA arch to build for (None: :func:`kerneljudge.device.build_arch` of this
            node's first GPU, else the default).
        ship: also return the packed cache entry (for a judging node that does not share the
            cache folder).

    Returns:
        ``(meta, blob)``: ``meta`` is ``{"key", "arch", "ok", "error"}`` (``error``: why no
        build was made, one line, or ""); ``blob`` is :func:`pack_entry`'s or None. Never
        raises for a job: a candidate that cannot be built here is built (and judged) again by
        the judging host, whose verdict or error is the job's.
    """
    meta: dict[str, Any] = {"key": "", "arch": arch or "", "ok": False, "error": ""}
    try:
        job = Job.from_dict(job_data)
        cand = Candidate.from_source(job.source, name=job.name)
        cache = BuildCache(cache_dir or job.options.cache_dir)
        meta["arch"] = arch = arch or build_arch(None)
        result = build(cand, cache=cache, arch=arch, timeout_s=job.options.build_timeout_s)
        meta["key"] = cache.key(cand, arch)
        meta["ok"] = result.ok
        return meta, (pack_entry(cache, meta["key"]) if ship else None)
    except Exception as exc:  # every failure is the judging host's to find again
        meta["error"] = one_line(exc)
        return meta, None


# ---------------------------------------------------------------- judging host (one actor)
class JudgeHost:
    """Warm judges on one device, one job at a time (a Ray actor's body): a
    :class:`~kerneljudge.executors._warm.WarmJudges` and the actor's answer format.

    Args:
        device: ``"cpu"`` or ``"cuda:0"`` (the actor's one visible GPU).
        cache_dir: the build cache folder (None: each job's ``options.cache_dir``, else the
            default).
        threads: torch threads of the judges' workers (0: torch's default).
        max_judges: warm judges kept (least recently used closed first); one per
            (problem, cache folder).

    Attributes:
        tmp: the host's own temporary folder when it has one (:func:`own_tmp`, made before
            this runs), removed by :meth:`shutdown`; else None.
    """

    tmp: HostTmp | None = None

    def __init__(
        self, device: str, cache_dir: str | None, threads: int = 0, max_judges: int = 4
    ) -> None:
        self.device = device
        self.cache_dir = cache_dir
        self.threads = threads
        self._warm = WarmJudges(device, max_judges)
        self.max_judges = self._warm.max_judges

    def ready(self) -> dict[str, Any]:
        """Where this host runs: ``{"node_id", "pid", "arch", "tmp"}`` (``node_id`` filled in
        by the actor wrapper; ``arch``: the CUDA arch its judges build for on its device;
        ``tmp``: its own temporary folder, or "")."""
        tmp = str(self.tmp.path) if self.tmp is not None else ""
        return {"node_id": "", "pid": os.getpid(), "arch": self._warm.arch(), "tmp": tmp}

    def judge(self, job_data: dict[str, Any], meta: dict[str, Any] | None, blob: Any) -> dict:
        """Judge one job; the answer dict of this module's docstring. ``meta`` and ``blob``
        are :func:`build_job`'s (None: no build was made ahead; the judge builds)."""

        def install(config: JudgeConfig) -> None:
            if meta and meta.get("key") and isinstance(blob, bytes | bytearray):
                install_entry(BuildCache(config.cache_dir), meta["key"], bytes(blob))

        outcome = self._warm.run(
            job_data,
            lambda job: job_config(job, self.device, self.cache_dir, self.threads),
            prepare=install,
        )
        answer: dict[str, Any]
        if outcome.verdict is None:
            answer = {"error": outcome.message, "kind": outcome.kind}
        else:
            answer = {"verdict": outcome.verdict.to_dict()}
        answer["busy_s"] = outcome.busy_s
        self._warm.refill()  # the next new problem's processes (a Ray answer ends the call)
        return answer

    def warm(self) -> list[str]:
        """The problems of the warm judges, least recently used first."""
        return self._warm.warm()

    def shutdown(self) -> None:
        """Close every warm judge (their worker processes end), then remove the host's own
        temporary folder (:attr:`tmp`): the host's last call, it judges nothing after."""
        self._warm.close()
        if self.tmp is not None:
            self.tmp.remove()


def own_tmp() -> HostTmp:
    """Give this process (a judging actor) a temporary folder of its own: a
    :class:`~kerneljudge.worker.host_tmp.HostTmp` ``kerneljudge-actor-*`` in the system's
    temporary folder, made after a sweep of the folders whose hosts have ended (an actor killed
    outright cannot remove its own), its lock held until this process ends, and used from now
    on (``TMPDIR``, :data:`tempfile.tempdir`).

    Raises:
        OSError: the folder could not be made.
    """
    tmp = HostTmp.make(ACTOR)
    tmp.use()
    return tmp


#: Seconds between a judging actor's checks that its parent (its node's raylet) is alive.
PARENT_POLL_S = 1.0


def exit_when_orphaned() -> None:
    """End this process (exit status 1) once its parent is no longer the one it has now,
    checked every :data:`PARENT_POLL_S` seconds on a daemon thread.

    A raylet killed outright (its node lost) leaves its workers running until they next speak
    to it; a judging actor in the middle of a long job would judge on for minutes on a node the
    cluster has already declared dead. Its judges' workers follow it (``PR_SET_PDEATHSIG``).
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
