"""A profile of a worker's request handlers, for finding where a verdict's time and device
memory go in the workers (``benchmarks/verdict_profile.py --workers``); off unless
:data:`PROFILE_ENV` is set; the device memory alone (no cProfile) with :data:`MEMORY_ENV`."""

from __future__ import annotations

import contextlib
import cProfile
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "MEMORY_ENV",
    "MEMORY_FILE",
    "PROFILE_ENV",
    "PROFILE_FILE",
    "RequestProfiler",
    "kept_folder",
    "keep_profile",
]

#: Environment variable naming a folder: when set, every worker profiles its request handlers
#: (cProfile) and the supervisor copies each worker's profile there when it closes the worker.
PROFILE_ENV = "KERNELJUDGE_WORKER_PROFILE"
#: Environment variable naming a folder: when set (and :data:`PROFILE_ENV` is not), every CUDA
#: worker writes only its :data:`MEMORY_FILE`, without cProfile's cost on its requests, and the
#: supervisor copies it there as it does a profile.
MEMORY_ENV = "KERNELJUDGE_WORKER_MEMORY"
#: The profile's file name in a worker's scratch folder.
PROFILE_FILE = "requests.prof"
#: The file in a worker's scratch folder with one line per request on a CUDA worker: the wall
#: clock (s), the request, then torch's allocated and reserved device memory after it and the
#: allocated peak during it (GiB), and the device's free memory after it (GiB, all processes).
MEMORY_FILE = "requests.mem"


class RequestProfiler:
    """A ``cProfile`` of a worker's request handlers when :data:`PROFILE_ENV` is set, written
    to the worker's scratch folder (``TMPDIR``) as :data:`PROFILE_FILE` after every request;
    the supervisor keeps it when it closes the worker (``benchmarks/verdict_profile.py
    --workers``). On a CUDA worker, with :data:`PROFILE_ENV` or :data:`MEMORY_ENV` set, a line
    of its device memory per request in :data:`MEMORY_FILE`. Neither set: it does nothing."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile() if os.environ.get(PROFILE_ENV) else None
        self.memory = bool(os.environ.get(PROFILE_ENV) or os.environ.get(MEMORY_ENV))

    @contextlib.contextmanager
    def request(self, op: str = "") -> Iterator[None]:
        if not self.memory:
            yield
            return
        cuda = _cuda()
        if cuda is not None:
            _quietly(cuda.reset_peak_memory_stats)
        if self.profile is not None:
            self.profile.enable()
        try:
            yield
        finally:
            if self.profile is not None:
                self.profile.disable()
                # Written beside, then renamed: a worker closed while it writes leaves the last
                # whole profile, never a truncated one.
                path = os.path.join(tempfile.gettempdir(), PROFILE_FILE)
                self.profile.dump_stats(path + ".part")
                os.replace(path + ".part", path)
            cuda = cuda or _cuda()  # the request may have made the context
            if cuda is not None:  # a device error here must not replace the request's outcome
                _quietly(lambda: _memory_line(cuda, op))


def _quietly(work: Any) -> None:
    try:
        work()
    except Exception:  # noqa: BLE001 - a sticky device error: the request reports its own
        pass


def _cuda() -> Any:
    """``torch.cuda`` where this worker has made a CUDA context, else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


def _memory_line(cuda: Any, op: str) -> None:
    gib = 2**30
    free, _ = cuda.mem_get_info()
    line = (
        f"{time.time():.3f} {op} allocated {cuda.memory_allocated() / gib:.2f} "
        f"reserved {cuda.memory_reserved() / gib:.2f} "
        f"peak {cuda.max_memory_allocated() / gib:.2f} free {free / gib:.2f}\n"
    )
    with open(os.path.join(tempfile.gettempdir(), MEMORY_FILE), "a") as f:
        f.write(line)


def kept_folder() -> str:
    """The folder closed workers' profiles are copied to: :data:`PROFILE_ENV`'s, else
    :data:`MEMORY_ENV`'s, else empty (nothing is kept)."""
    return os.environ.get(PROFILE_ENV) or os.environ.get(MEMORY_ENV) or ""


def keep_profile(scratch: Path, folder: Path, stem: str, limit: int = 1 << 30) -> None:
    """Copy a closed worker's :data:`PROFILE_FILE` and :data:`MEMORY_FILE` from its ``scratch``
    folder to ``folder`` as ``<stem>.prof`` and ``<stem>.mem``: each only where it is a regular
    file of at most ``limit`` bytes, opened without following a link (a candidate could leave
    one to a file of the supervisor's user), its bytes alone (no mode bits). ``folder`` is made
    where it is missing; a copy that cannot be written is skipped."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    for name, suffix in ((PROFILE_FILE, "prof"), (MEMORY_FILE, "mem")):
        try:
            fd = os.open(scratch / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f, contextlib.suppress(OSError):
            info = os.fstat(f.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size <= limit:
                with open(folder / f"{stem}.{suffix}", "wb") as out:
                    shutil.copyfileobj(f, out)
