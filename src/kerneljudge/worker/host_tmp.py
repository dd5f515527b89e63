"""The temporary folder of a process that hosts judges (a local executor's slot process, a Ray
judging actor, the local executor itself): a folder of its own, removed when it ends, however
it ends.

Every temporary folder a judge makes (its workers' ``kj-*`` scratch folders, ``kj-probe-*``,
``kj-nvcc-*``, ...) is made in the temporary folder of the process that hosts it
(:func:`tempfile.gettempdir`). A host whose temporary folder is a :class:`HostTmp`
(:meth:`HostTmp.use`: ``TMPDIR`` and :data:`tempfile.tempdir` point there) leaves nothing
behind: whoever owns it removes the folder when the host ends in order
(:meth:`HostTmp.remove`), and the folder of a host killed outright (SIGKILL, the OOM killer,
its executor killed) is removed by the next :func:`sweep`, which every new host runs before it
makes its own (:meth:`HostTmp.make`).

A host folder is ``<prefix><random>`` (a prefix of :data:`PREFIXES`) directly in the base
temporary folder, mode 0700, and holds :data:`LOCK_FILE`, locked (``flock``, exclusive) from
before that name appears until every process holding it has ended: the kernel releases the
lock when the last of them ends, however it ends, and a lock means the same in every PID
namespace (a process id does not). :func:`sweep` removes a folder only once it takes its lock.

No prefix starts with ``kj-`` (a worker's scratch folder, which candidates may write): caches
the judge trusts may lie beneath a host folder (:func:`kerneljudge.worker.kernel_cache.usable`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "ACTOR",
    "EXECUTOR",
    "LOCK_FILE",
    "PREFIXES",
    "SLOT",
    "HostTmp",
    "base_folder",
    "sweep",
]

#: A local executor's slot process.
SLOT = "kerneljudge-slot-"
#: A Ray executor's judging actor.
ACTOR = "kerneljudge-actor-"
#: A local executor's own folder (its slots' logs).
EXECUTOR = "kerneljudge-executor-"
PREFIXES = (SLOT, ACTOR, EXECUTOR)
#: The lock file in a host folder.
LOCK_FILE = "owner.lock"
#: Seconds a host folder without its lock file is left alone (its maker may be between the
#: folder's creation and the lock file's; one that died there leaves it empty).
UNLOCKED_GRACE_S = 3600.0
#: Seconds :meth:`HostTmp.remove` keeps trying while something still writes in the folder.
REMOVE_TIMEOUT_S = 10.0


class HostTmp:
    """A host's temporary folder and this process's hold on its lock.

    Attributes:
        path: the folder.
        lock_fd: a descriptor of its lock file that holds the lock (not inherited by a child
            unless passed to it: the child then holds the lock too); -1 once released.
    """

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self._guard = threading.Lock()

    @classmethod
    def make(cls, prefix: str, base: str | None = None) -> HostTmp:
        """:func:`sweep` ``base``, then make a new folder ``<prefix><random>`` there, its lock
        held by this process.

        Args:
            prefix: one of :data:`PREFIXES`.
            base: the folder to make it in (None: :func:`tempfile.gettempdir`).

        Raises:
            ValueError: ``prefix`` is not one of :data:`PREFIXES`.
            OSError: the folder or its lock could not be made (nothing of it is left).
        """
        if prefix not in PREFIXES:
            raise ValueError(f"not a host folder prefix: {prefix!r}")
        sweep(base)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        try:
            # Locked before it gets its name: a sweep never finds it unlocked.
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path / ".owner.new", flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(path / ".owner.new", path / LOCK_FILE)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, fd)

    def use(self) -> None:
        """Make the folder this process's temporary folder (``TMPDIR``, which children
        inherit, and :data:`tempfile.tempdir`)."""
        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = str(self.path)

    def release(self) -> None:
        """Close this process's descriptor of the lock (the lock ends with its last holder).
        Idempotent."""
        with self._guard:
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1

    def remove(self, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
        """Remove the folder, under its lock, then :meth:`release` the lock. A process that
        still writes there (a worker in its last moment) is outlasted: the removal is tried
        again until the folder is gone or ``timeout_s`` seconds have passed. Idempotent.

        Returns:
            True when the folder is gone.
        """
        with self._guard:
            gone = _remove(self.path, None, timeout_s)
        self.release()
        return gone


def base_folder() -> Path:
    """The folder host folders are made in: :func:`tempfile.gettempdir`'s parent in a host
    whose temporary folder is its host folder, else :func:`tempfile.gettempdir` (resolved)."""
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    return tmp.parent if tmp.name.startswith(PREFIXES) else tmp


def sweep(base: str | None = None) -> list[str]:
    """Remove the host folders whose every holder has ended.

    Looks at the entries of ``base`` (None: :func:`tempfile.gettempdir`) whose name starts with
    one of :data:`PREFIXES`, and only at those that are folders (a link is never followed)
    owned by this process's user. One whose lock this process takes is removed, under the
    lock; one whose lock is held (its owner lives) is left, and so is one without a lock file
    for less than :data:`UNLOCKED_GRACE_S` seconds.

    Returns:
        The names of the folders removed. Never raises ``OSError``: what cannot be read or
        removed is left.
    """
    removed: list[str] = []
    try:
        base_fd = os.open(base or tempfile.gettempdir(), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return removed
    try:
        names = [n for n in os.listdir(base_fd) if n.startswith(PREFIXES)]
        removed = [n for n in names if _sweep_one(base_fd, n)]
    except OSError:
        pass
    finally:
        os.close(base_fd)
    return removed


def _sweep_one(base_fd: int, name: str) -> bool:
    """Remove the host folder ``name`` of ``base_fd`` if its owner ended (see :func:`sweep`)."""
    try:
        st = os.lstat(name, dir_fd=base_fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=base_fd)
    except OSError:
        return False
    lock = -1
    try:
        here = os.fstat(folder)
        if (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
            return False  # replaced in between
        try:
            lock = os.open(LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
        except FileNotFoundError:
            if time.time() - st.st_mtime < UNLOCKED_GRACE_S:
                return False
        try:
            if lock >= 0:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its owner lives
        return _remove(name, base_fd, REMOVE_TIMEOUT_S)
    except OSError:
        return False
    finally:
        if lock >= 0:
            os.close(lock)
        os.close(folder)


def _remove(path: Path | str, dir_fd: int | None, timeout_s: float) -> bool:
    """Remove the tree ``path`` (relative to ``dir_fd`` when given; a link there is not
    followed), trying again while it is still there, for up to ``timeout_s`` seconds; whether
    it is gone. A folder a process made unwritable is made writable again first."""

    def writable(func: Any, failed: str, info: Any) -> None:
        with contextlib.suppress(OSError):  # rmtree's own rules, relaxed for one entry
            parent = os.path.dirname(failed) or "."
            mode = os.stat(parent, dir_fd=dir_fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(parent, stat.S_IMODE(mode) | 0o700, dir_fd=dir_fd)

    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError):
            shutil.rmtree(path, onerror=writable, dir_fd=dir_fd)
        try:
            os.lstat(path, dir_fd=dir_fd)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
