"""A CUDA reference worker's own kernel cache, filled from the earlier ones'.

A CUDA reference worker compiles kernels at run time at its start (jiterator's, through
NVRTC: the fused digest, :func:`kerneljudge.worker.digest.warm`, and the fused comparison,
:func:`kerneljudge.check.fused.warm`): about 8 s of a 12 s start on an H100, against 3.6 s to
ready when torch's kernel cache on disk already held them
(docs/benchmarks/2026-12-06-h100-kernelbench-15-size-scaling-worker-start.md). torch names a
cached kernel by what any process can compute and loads it unchecked, so a reference worker
never uses torch's default cache (``~/.cache/torch/kernels``), which a candidate may write to.

Here each CUDA reference worker gets a cache folder of its own, :data:`FOLDER` in its scratch
folder (made by this process with :func:`tempfile.mkdtemp`, so mode 0700, and removed with the
worker). torch writes a kernel there through a temporary file named by the writer's process id,
the same in every worker's PID namespace: one writer per folder is what that needs. Each
reference worker that reports ready adds the files of its folder to this process's *seed*
(the kernels' bytes, by file name), read once the worker reported ready and before any request
was sent to it, so before any problem's code ran in it. Each later reference worker's folder
is filled with the seed before the worker starts, and it loads those kernels instead of
compiling them. The seed lives in this process's memory only: no kernel an earlier run left on
disk is ever loaded.

Only where Landlock (ABI 3 or later) confines every process that runs candidate code (without
it a candidate could write to a reference worker's folder); a folder is also protected
(:func:`kerneljudge.worker.confine.protect`) while its worker lives. Elsewhere a reference
worker's kernel cache is off (``USE_PYTORCH_KERNEL_CACHE=0``).
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path

from kerneljudge.worker import confine
from kerneljudge.worker.environment import candidates_cache_folders

__all__ = [
    "FOLDER",
    "MAX_SEED_BYTES",
    "environment",
    "forget",
    "keep_seed",
    "release",
    "seed",
    "usable",
]

#: The kernel cache's folder in a reference worker's scratch folder.
FOLDER = "kernels"
#: The seed holds at most this many bytes, all files together (the three kernels of a
#: reference worker's start are well under 1 MiB).
MAX_SEED_BYTES = 64 << 20

_seed: dict[str, bytes] = {}
_lock = threading.Lock()


def usable(device: str) -> bool:
    """Whether a reference worker on ``device`` gets a kernel cache: a CUDA device, Landlock
    of ABI 3 or later confining candidates (:func:`kerneljudge.worker.confine.features`), and
    the temporary folder (where the worker's scratch folder is made) beneath no folder where
    candidates' JIT compilers write (:func:`kerneljudge.worker.environment.
    candidates_cache_folders`) and beneath no worker's scratch folder (``kj-*``): a
    candidate worker already running when the folder is made keeps the rules it was given."""
    f = confine.features()
    if not (device.startswith("cuda") and f.enabled and f.landlock_abi >= 3):
        return False
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    return not any(tmp.is_relative_to(t) for t in candidates_cache_folders()) and not any(
        part.startswith("kj-") for part in tmp.parts
    )


def environment(scratch: Path, device: str) -> dict[str, str]:
    """The kernel cache variables of a reference worker on ``device`` whose scratch folder is
    ``scratch``: where :func:`usable`, :data:`FOLDER` is made there (a failure to make or fill
    it leaves the cache off), filled with this process's seed, protected, and named
    (``PYTORCH_KERNEL_CACHE_PATH``, ``USE_PYTORCH_KERNEL_CACHE=1``); else the cache is off
    (``USE_PYTORCH_KERNEL_CACHE=0``)."""
    off = {"USE_PYTORCH_KERNEL_CACHE": "0"}
    if not usable(device):
        return off
    folder = scratch / FOLDER
    with _lock:
        files = dict(_seed)
    try:
        folder.mkdir(mode=0o700)
        for name, data in files.items():
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError:
        return off
    confine.protect(folder)
    return {"USE_PYTORCH_KERNEL_CACHE": "1", "PYTORCH_KERNEL_CACHE_PATH": str(folder)}


def keep_seed(scratch: Path) -> int:
    """Add to this process's seed the regular files of ``scratch``'s :data:`FOLDER` that it
    lacks (links and other entries are left out; nothing is added where the seed would pass
    :data:`MAX_SEED_BYTES` or the folder cannot be read). Call it once the worker reported
    ready, before any request is sent to it. Returns the seed's file count."""
    folder = scratch / FOLDER
    with _lock:
        found: dict[str, bytes] = {}
        size = sum(map(len, _seed.values()))
        try:
            for entry in os.scandir(folder):
                if entry.name in _seed or not entry.is_file(follow_symlinks=False):
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                        continue
                    found[entry.name] = f.read(MAX_SEED_BYTES + 1)
                size += len(found[entry.name])
                if size > MAX_SEED_BYTES:
                    return len(_seed)
        except OSError:
            return len(_seed)
        _seed.update(found)
        return len(_seed)


def seed() -> dict[str, bytes]:
    """A copy of this process's seed: file name -> bytes (empty: none yet)."""
    with _lock:
        return dict(_seed)


def forget() -> None:
    """Drop this process's seed: the next reference worker compiles its kernels anew and gives
    the next seed."""
    with _lock:
        _seed.clear()


def release(scratch: Path) -> None:
    """Stop protecting ``scratch``'s :data:`FOLDER` (its worker has ended)."""
    confine.unprotect(scratch / FOLDER)
