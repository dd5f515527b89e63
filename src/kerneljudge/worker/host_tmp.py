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
temporary folder, mode 0700. The folder itself is locked (``flock``, exclusive, on a
descriptor of the folder) from before that name appears until every process holding the
descriptor has ended: the kernel releases the lock when the last of them ends, however it
ends, a lock means the same in every PID namespace (a process id does not), and no file in the
folder carries it (a cleaner of old files in the temporary folder cannot take it away).
:func:`sweep` removes a folder only once it takes its lock, and keeps the lock until the
folder is gone.

Nothing here follows a link: folders are opened relative to their parent's descriptor with
``O_NOFOLLOW``, and a folder made unwritable inside (a candidate may do that to its scratch
folder) is made writable again through a descriptor of that very folder.

No prefix starts with ``kj-`` (a worker's scratch folder, which candidates may write): caches
the judge trusts may lie beneath a host folder (:func:`kerneljudge.worker.kernel_cache.usable`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path

__all__ = [
    "ACTOR",
    "EXECUTOR",
    "PREFIXES",
    "SLOT",
    "HostTmp",
    "base_folder",
    "held",
    "sweep",
]

#: A local executor's slot process.
SLOT = "kerneljudge-slot-"
#: A Ray executor's judging actor.
ACTOR = "kerneljudge-actor-"
#: A local executor's own folder (its slots' logs).
EXECUTOR = "kerneljudge-executor-"
PREFIXES = (SLOT, ACTOR, EXECUTOR)
#: A host folder's name while it is made, before it is locked and renamed (not a host folder
#: yet: only :data:`UNLOCKED_GRACE_S` after its last change does a sweep take it).
MAKING = ".kerneljudge-making-"
#: Seconds a folder of the :data:`MAKING` name is left alone (its maker may be between making
#: it and locking it; one that died there leaves it empty).
UNLOCKED_GRACE_S = 3600.0
#: Seconds :meth:`HostTmp.remove` keeps trying while something still writes in the folder.
REMOVE_TIMEOUT_S = 10.0
#: Seconds :func:`sweep` tries one folder (its owners have ended; a worker dying with them may
#: still write for a moment, and a folder left is taken by a later sweep).
SWEEP_TIMEOUT_S = 1.0
#: Folders deeper than this below a host folder are not removed (the removal recurses).
MAX_DEPTH = 64

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HostTmp:
    """A host's temporary folder and this process's hold on its lock.

    Attributes:
        path: the folder.
        lock_fd: a descriptor of the folder that holds its lock (not inherited by a child
            unless passed to it: the child then holds the lock too); -1 once released.
    """

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self.lock_fd = lock_fd
        self._guard = threading.Lock()

    @classmethod
    def make(cls, prefix: str, base: str | None = None) -> HostTmp:
        """:func:`sweep` ``base``, then make a new folder ``<prefix><random>`` there (64 random
        bits), its lock held by this process.

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
        making = Path(tempfile.mkdtemp(prefix=MAKING, dir=base))
        try:
            # Locked before it gets its name: a sweep never finds a host folder unlocked.
            fd = os.open(making, _DIR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path = making.with_name(prefix + secrets.token_hex(8))
                if os.path.lexists(path):
                    raise FileExistsError(f"{path} exists")
                os.rename(making, path)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(making)
            raise
        return cls(path, fd)

    def use(self) -> None:
        """Make the folder this process's temporary folder (``TMPDIR``, which children
        inherit, and :data:`tempfile.tempdir`)."""
        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = str(self.path)

    def release(self) -> None:
        """Close this process's descriptor of the folder (the lock ends with its last
        holder). Idempotent."""
        with self._guard:
            if self.lock_fd >= 0:
                os.close(self.lock_fd)
                self.lock_fd = -1

    def remove(self, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
        """Remove the folder while holding its lock, then :meth:`release` the lock. A process
        that still writes there (a worker in its last moment) is outlasted: the removal is
        tried again until the folder is gone or ``timeout_s`` seconds have passed.
        Idempotent.

        Returns:
            True when the folder is gone.
        """
        with self._guard:
            gone = _remove_at(str(self.path.parent), self.path.name, timeout_s)
        self.release()
        return gone


def base_folder() -> Path:
    """The folder host folders are made in: :func:`tempfile.gettempdir`'s parent in a host
    whose temporary folder is its host folder, else :func:`tempfile.gettempdir` (resolved)."""
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    return tmp.parent if tmp.name.startswith(PREFIXES) else tmp


def held(folder: Path) -> bool:
    """Whether a process holds ``folder``'s lock (a host of that folder lives; a process whose
    main thread has ended holds it until its last thread has too).

    Raises:
        OSError: ``folder`` cannot be opened as a folder (it is gone, or a link).
    """
    fd = os.open(folder, _DIR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def sweep(base: str | None = None) -> list[str]:
    """Remove the host folders whose every holder has ended.

    Looks at the entries of ``base`` (None: :func:`tempfile.gettempdir`) whose name starts with
    one of :data:`PREFIXES` (or is :data:`MAKING`'s and unchanged for
    :data:`UNLOCKED_GRACE_S` seconds), and only at those that are folders (a link is never
    followed) owned by this process's user. One whose lock this process takes is removed,
    under the lock (for up to :data:`SWEEP_TIMEOUT_S` seconds; what is left stays for a later
    sweep); one whose lock is held (its owner lives) is left.

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
        names = [n for n in os.listdir(base_fd) if n.startswith((*PREFIXES, MAKING))]
        removed = [n for n in names if _sweep_one(base_fd, n)]
    except OSError:
        pass
    finally:
        os.close(base_fd)
    return removed


def _sweep_one(base_fd: int, name: str) -> bool:
    """Remove the host folder ``name`` of ``base_fd`` if its owners ended (see :func:`sweep`)."""
    try:
        st = os.lstat(name, dir_fd=base_fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if name.startswith(MAKING) and time.time() - st.st_mtime < UNLOCKED_GRACE_S:
            return False
        folder = os.open(name, _DIR, dir_fd=base_fd)
    except OSError:
        return False
    try:
        here = os.fstat(folder)
        if (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
            return False  # replaced in between
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its owner lives
        return _remove_at(base_fd, name, SWEEP_TIMEOUT_S, (here.st_dev, here.st_ino))
    finally:
        os.close(folder)


def _remove_at(
    parent: int | str, name: str, timeout_s: float, identity: tuple[int, int] | None = None
) -> bool:
    """Remove the folder ``name`` of ``parent`` (a descriptor or a path) and everything in it,
    trying again while it is still there, for up to ``timeout_s`` seconds; whether it is gone.
    ``identity``: the folder's (device, inode), checked before each try (None: not checked)."""
    deadline = time.monotonic() + timeout_s
    parent_fd = (
        parent
        if isinstance(parent, int)
        else os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    )
    try:
        while True:
            try:
                folder = os.open(name, _DIR, dir_fd=parent_fd)
                try:
                    st = os.fstat(folder)
                    if identity is not None and (st.st_dev, st.st_ino) != identity:
                        return False  # another folder took the name
                    _clear(folder, 0)
                finally:
                    os.close(folder)
                os.rmdir(name, dir_fd=parent_fd)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
            time.sleep(0.05)
    finally:
        if not isinstance(parent, int):
            os.close(parent_fd)


def _clear(folder: int, depth: int) -> None:
    """Remove every entry of the folder open as ``folder`` (links removed, never followed; a
    folder in it made writable and searchable first, through a descriptor of that folder).

    Raises:
        OSError: an entry could not be removed, or folders nest deeper than :data:`MAX_DEPTH`.
    """
    for name in os.listdir(folder):
        try:
            st = os.lstat(name, dir_fd=folder)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=folder)
            continue
        if depth >= MAX_DEPTH:
            raise OSError(f"folders nested deeper than {MAX_DEPTH}")
        if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
            _owner_rwx(folder, name)
        sub = os.open(name, _DIR, dir_fd=folder)
        try:
            _clear(sub, depth + 1)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=folder)


def _owner_rwx(folder: int, name: str) -> None:
    """Give the folder ``name`` of ``folder`` its owner's read, write and search rights, through
    an ``O_PATH`` descriptor of that folder (opened without following a link, so the change
    cannot be sent elsewhere). Where ``/proc`` is not mounted nothing changes."""
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    try:
        here = f"/proc/self/fd/{fd}"
        with contextlib.suppress(FileNotFoundError):
            os.chmod(here, stat.S_IMODE(os.stat(here).st_mode) | 0o700)
    finally:
        os.close(fd)
