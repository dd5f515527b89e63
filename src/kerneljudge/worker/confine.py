"""Operating-system confinement of worker processes (the first line of defence).

Supervisor side (:func:`command`, :func:`spawn`, :func:`features`, :func:`layers`): a worker is
started as ``setpriv --pdeathsig KILL -- unshare --pid --fork --kill-child --mount-proc --net
--mount [--user --map-root-user] -- python -P confine.py POLICY -- MODULE ARGS``:
``setpriv --pdeathsig KILL`` kills ``unshare`` when the supervisor thread that started it dies
(every worker is started from one long-lived thread, :func:`spawn`, which dies only with the
supervisor, SIGKILL included); with ``--kill-child`` the worker gets SIGKILL when ``unshare``
dies; the worker is PID 1 of its own PID namespace, and when it dies the kernel kills every
process in that namespace (double-forked, ``setsid``'d, stopped: all of them); ``--mount-proc``:
its ``/proc`` lists only its own namespace (it cannot name, signal, trace or read any process
outside); ``--net``: only a loopback interface, which is down; ``--mount``: a private tmpfs
replaces ``/dev/shm``.

Child side (this file run as a script, before any thread exists and before the package, torch
or candidate code is imported): mount the private ``/dev/shm``, set ``no_new_privs`` and
``PR_SET_PDEATHSIG``, apply Landlock (read and execute everywhere; write, create and remove only
in the policy's folders and device files; TCP bind/connect denied from ABI 4; signals and
abstract unix sockets scoped to the worker from ABI 6), lock a CPU worker's scheduling
(:mod:`kerneljudge.worker.scheduling`), then run the worker module. Features are probed once
(:func:`features`); a worker starts without a missing one (:func:`layers`).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import queue
import runpy
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "Features",
    "command",
    "features",
    "landlock_abi",
    "layers",
    "protect",
    "restrict",
    "rule_folders",
    "spawn",
    "spawn_in",
    "unprotect",
]

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_SIGKILL = 9
_MS_NOSUID, _MS_NODEV = 2, 4
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
# Landlock access rights (linux/landlock.h), by the ABI that introduced them.
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1, 2, 4, 8
_FS_REMOVE_DIR, _FS_REMOVE_FILE, _FS_MAKE_CHAR, _FS_MAKE_DIR = 16, 32, 64, 128
_FS_MAKE_REG, _FS_MAKE_SOCK, _FS_MAKE_FIFO = 256, 512, 1024
_FS_MAKE_BLOCK, _FS_MAKE_SYM = 2048, 4096
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL, _READ = 1, 2, _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
#: Device files a worker may open for writing (besides ``/dev/nvidia*``).
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Size of the private ``/dev/shm`` of a worker.
SHM_SIZE = "256m"
_NAMESPACE_FLAGS = ("--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount")


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _scheduling() -> dict[str, Any]:  # by path: standard library only, as this file
    return runpy.run_path(str(Path(__file__).with_name("scheduling.py")))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none, or not Linux x86_64/aarch64)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0), 1)
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def _fs_rights(abi: int) -> tuple[int, int]:
    """(every right Landlock handles at ``abi``, the rights of a writable folder)."""
    handled = (1 << 13) - 1
    if abi >= 2:
        handled |= _FS_REFER
    if abi >= 3:
        handled |= _FS_TRUNCATE
    return handled, handled & ~(_FS_MAKE_CHAR | _FS_MAKE_BLOCK)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict(abi: int, writable: Sequence[str], devices: Sequence[str]) -> None:
    """Apply Landlock to the calling thread and every process and thread it starts later.

    Read and execute stay allowed everywhere; writing, creating, removing and renaming only
    beneath ``writable`` (resolved paths; one that does not exist is created first; one that
    cannot be, or opens as another path, a link made since, is left out), and writing into the
    ``devices`` files and the process's own ``/proc`` files. From ABI 4 every TCP bind and
    connect is denied; from ABI 6 signals out of this domain and abstract unix sockets too.

    Raises:
        OSError: a system call failed (Landlock missing, a rule the kernel refused).
    """
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    handled, write = _fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(
        ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), 0
    )
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    file_rights = _FS_WRITE_FILE | _FS_READ_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
    try:
        rules = [("/", _READ), (f"/proc/{os.getpid()}", file_rights)]  # its own /proc files
        for folder in writable:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError:
                continue  # a folder it cannot create it could not write either
            rules.append((folder, write))
        rules += [(dev, file_rights) for dev in devices if os.path.exists(dev)]
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if rights == write and os.readlink(f"/proc/self/fd/{fd}") != path:
                    continue  # a link made since the supervisor resolved it: left out
                rule = _PathBeneath(rights, fd)
                if libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ruleset, 1, ctypes.byref(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path} failed")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ruleset, 0):
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def _mount_private_shm() -> None:
    libc = _libc()
    opts = f"size={SHM_SIZE},mode=1777".encode()
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts):
        raise OSError(ctypes.get_errno(), "mounting a private /dev/shm failed")


# ---------------------------------------------------------------------- supervisor side
@dataclass(frozen=True)
class Features:
    """What confinement works on this host, for this user (see :func:`features`).

    Attributes:
        setpriv: path of util-linux ``setpriv`` ("" when missing: ``PR_SET_PDEATHSIG`` is set
            by a ``preexec_fn`` instead).
        unshare: the ``unshare`` command prefix that works ("()" when none does: no namespaces).
        user_namespace: the prefix maps the caller to root of a new user namespace.
        private_shm: the worker could mount its own ``/dev/shm``.
        landlock_abi: the kernel's Landlock ABI (0: none).
        scheduling: confined processes lock their CPU scheduling (:mod:`.scheduling`).
        enabled: False when ``KERNELJUDGE_CONFINE=off`` turned every OS layer off.
    """

    setpriv: str
    unshare: tuple[str, ...]
    user_namespace: bool
    private_shm: bool
    landlock_abi: int
    enabled: bool = True
    scheduling: bool = False


_features: Features | None = None
_features_lock = threading.Lock()


def _probe_unshare(prefix: list[str]) -> bool | None:
    """None when ``prefix`` fails; else whether a private ``/dev/shm`` could be mounted."""
    try:
        out = subprocess.run(
            [*prefix, sys.executable, "-P", "-S", os.path.abspath(__file__), "--probe"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() == b"shm"


def features() -> Features:
    """Probe (once per process) which confinement works here. ``KERNELJUDGE_CONFINE=off`` in
    the environment turns every OS layer off (for measurements and debugging only)."""
    global _features
    with _features_lock:
        if _features is not None:
            return _features
        if os.environ.get("KERNELJUDGE_CONFINE", "").lower() in ("off", "0", "no"):
            _features = Features("", (), False, False, 0, enabled=False)
            return _features
        setpriv = shutil.which("setpriv") or ""
        unshare_bin = shutil.which("unshare")
        prefix: tuple[str, ...] = ()
        user_ns = shm = False
        if unshare_bin and sys.platform.startswith("linux"):
            tries = [[], ["--user", "--map-root-user"]]
            if os.geteuid() != 0:
                tries.reverse()
            for extra in tries:
                candidate = [unshare_bin, *extra, *_NAMESPACE_FLAGS, "--"]
                result = _probe_unshare(candidate)
                if result is not None:
                    prefix, user_ns, shm = tuple(candidate), bool(extra), result
                    break
        seccomp = _scheduling()["seccomp_available"]()
        _features = Features(setpriv, prefix, user_ns, shm, landlock_abi(), scheduling=seccomp)
        return _features


def layers(role: str = "candidate", device: str = "cpu") -> tuple[str, ...]:
    """Confinement layers of a ``role`` (``candidate``, ``build``) worker on ``device`` here:
    ``pid_namespace``, ``net_namespace``, ``mount_namespace``, ``user_namespace``,
    ``private_dev_shm``, ``landlock_abi_N``, ``scheduling_locked`` (not on a GPU: see
    :func:`command`), ``pdeathsig``, ``audit_hook``."""
    f = features()
    out = ["pdeathsig"] if f.enabled else []
    if f.unshare:
        out += ["pid_namespace", "net_namespace", "mount_namespace"]
        if f.user_namespace:
            out.append("user_namespace")
        if f.private_shm and role != "reference":
            out.append("private_dev_shm")
    if f.landlock_abi and role != "reference":
        out.append(f"landlock_abi_{f.landlock_abi}")
    if role != "reference":
        out += ["scheduling_locked"] if f.scheduling and not device.startswith("cuda") else []
        out.append("audit_hook")
    return tuple(out)


_PROTECTED: set[str] = set()


def protect(folder: str | os.PathLike[str]) -> None:
    """Give no confined process started from now on a rule for ``folder`` (resolved now), a
    folder above it or one beneath it (:func:`rule_folders`)."""
    _PROTECTED.add(os.path.realpath(folder))


def unprotect(folder: str | os.PathLike[str]) -> None:
    """Undo :func:`protect` for ``folder`` (resolved now, as :func:`protect` resolved it)."""
    _PROTECTED.discard(os.path.realpath(folder))


def rule_folders(writable: Sequence[str]) -> list[str]:
    """The folders of ``writable`` that get a rule, resolved, in order: less each whose path
    passes through a link lying in a folder of ``writable`` (one a process that may write
    there could have made) and each at, above or beneath a folder :func:`protect` was given."""
    resolved = [os.path.realpath(w) for w in writable]
    near = lambda a, b: os.path.commonpath([a, b]) in (a, b)  # noqa: E731
    out = []
    for given, real in zip(writable, resolved):
        parts = os.path.abspath(given).split(os.sep)
        links = [os.sep.join(parts[:i]) for i in range(2, len(parts) + 1)]
        made = [os.path.realpath(os.path.dirname(p)) for p in links if os.path.islink(p)]
        if any(os.path.commonpath([m, r]) == r for m in made for r in resolved):
            continue
        if not any(near(real, f) for f in list(_PROTECTED)):
            out.append(real)
    return out


def command(
    module_argv: Sequence[str],
    writable: Sequence[str] | None,
    devices: Sequence[str] = (),
    lock_scheduling: bool = True,
) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` (``module_argv``) confined.

    Args:
        module_argv: the module name and its arguments.
        writable: folders the worker may write beneath (None: no Landlock, for the trusted
            reference worker).
        devices: device files it may write besides :data:`DEVICE_FILES` (globs allowed).
        lock_scheduling: with ``writable``, lock its scheduling (:mod:`.scheduling`) if here.
    """
    f = features()
    policy: dict[str, Any] = {
        "pdeathsig": f.enabled,
        "shm": False,
        "landlock": 0,
        "init": bool(f.unshare),
        "parent": os.getpid(),  # the supervisor: the child's parent unless it is a namespace's
    }
    if writable is not None:
        devs = [*DEVICE_FILES]
        for pattern in devices:
            devs.extend(sorted(glob.glob(pattern)))
        write = rule_folders([str(w) for w in writable])
        if f.unshare and f.private_shm:
            policy["shm"] = True
            write.append(os.path.realpath("/dev/shm"))
        policy.update(landlock=f.landlock_abi, write=write, devices=devs)
        policy["sched"] = f.scheduling and lock_scheduling
    cmd: list[str] = []
    if f.setpriv:
        cmd += [f.setpriv, "--pdeathsig", "KILL", "--"]
    cmd += list(f.unshare)
    cmd += [sys.executable, "-P", os.path.abspath(__file__), json.dumps(policy), "--"]
    return cmd + list(module_argv)


def _die_with(parent: int) -> Callable[[], None]:
    """A function that arms ``PR_SET_PDEATHSIG`` (SIGKILL) for the process that calls it, a
    child of process ``parent``, then exits at once (status 1) if ``parent`` already died
    before the arming, when no signal would ever come (the child was re-parented, so
    ``getppid()`` differs). As a ``preexec_fn`` it runs between fork and exec: ``prctl`` is
    looked up here, before the fork."""
    prctl = _libc().prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


_spawn_queue: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] | None = None
_spawn_thread: threading.Thread | None = None
_spawn_pid = 0


def _spawner() -> None:
    assert _spawn_queue is not None
    while True:
        fn, box, done = _spawn_queue.get()
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box.append((False, exc))
        done.set()


def spawn(
    cmd: Sequence[str],
    cpus: set[int] | None = None,
    die_with_parent: bool | None = None,
    **popen_kwargs: Any,
) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, **popen_kwargs)`` run on one long-lived thread of this process.

    The parent-death signal of a child fires when the *thread* that forked it ends; starting
    every worker from this one thread (a daemon that lives as long as the process) makes it
    fire only when the supervisor process dies. With ``die_with_parent`` (None: unless
    ``KERNELJUDGE_CONFINE=off``) the child arms it before ``exec`` and exits if this process
    died before it could (:func:`_die_with`): a ``setpriv --pdeathsig`` in ``cmd`` arms it only
    after its own start, too late for a supervisor killed in between. ``cpus``: the cores the
    child starts on (inherited from the forking thread, which takes them during the fork)."""
    global _spawn_queue, _spawn_thread, _spawn_pid
    if features().enabled if die_with_parent is None else die_with_parent:
        popen_kwargs["preexec_fn"] = _die_with(os.getpid())

    def start() -> subprocess.Popen[bytes]:
        saved = os.sched_getaffinity(0) if cpus else None
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                saved = None
        try:
            return subprocess.Popen(list(cmd), **popen_kwargs)
        finally:
            if saved:
                os.sched_setaffinity(0, saved)

    with _features_lock:
        if _spawn_thread is None or _spawn_pid != os.getpid():  # none yet, or a forked copy
            _spawn_pid = os.getpid()
            _spawn_queue = queue.SimpleQueue()
            _spawn_thread = threading.Thread(
                target=_spawner, name="kerneljudge-spawner", daemon=True
            )
            _spawn_thread.start()
    assert _spawn_queue is not None
    box: list[Any] = []
    done = threading.Event()
    _spawn_queue.put((start, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def spawn_in(
    folder: Path, module_argv: Sequence[str], log: IO[bytes], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start ``python -m MODULE ARGS`` (``module_argv``) confined to write only beneath
    ``folder`` (its working directory), in a session of its own, with no standard input and
    its output and errors going to ``log``."""
    return spawn(command(module_argv, [str(folder)]), stdin=subprocess.DEVNULL, stdout=log,
                 stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=folder)  # fmt: skip


# ---------------------------------------------------------------------- child side
def _enter(policy: dict[str, Any]) -> None:
    if policy.get("pdeathsig"):  # its parent: the supervisor (which may be PID 1), or the
        # namespace's init that forked it (which ends with ``unshare --kill-child``)
        _die_with(os.getppid() if policy.get("init") else policy.get("parent", os.getppid()))()
    if policy.get("shm"):
        _mount_private_shm()
    if policy.get("landlock"):
        restrict(int(policy["landlock"]), policy.get("write", []), policy.get("devices", []))
    if policy.get("sched"):
        _scheduling()["lock_scheduling"]()


def _init(worker: int) -> None:
    """PID 1 of the worker's namespace: reap every process that ends in it and exit when the
    worker (``worker``) does, with its status (128 + N when signal N killed it; PID 1 itself
    could not be killed by the signals a worker sends itself). The kernel then kills whatever
    is left in the namespace."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(70)
        except InterruptedError:  # pragma: no cover - retried by Python itself
            continue
        if pid == worker:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.waitstatus_to_exitcode(status))


def _main(argv: list[str]) -> None:
    if argv == ["--probe"]:
        try:
            _mount_private_shm()
            print("shm")
        except OSError:
            print("no-shm")
        return
    policy, sep, module, *args = argv
    if sep != "--":
        raise SystemExit("usage: confine.py POLICY -- MODULE ARGS...")
    settings = json.loads(policy)
    if settings.get("init") and os.getpid() == 1:
        worker = os.fork()
        if worker:
            _init(worker)
    try:
        _enter(settings)
    except OSError as exc:
        print(f"kerneljudge: confinement failed: {exc}", file=sys.stderr)
        raise SystemExit(70) from None
    sys.argv = [module, *args]
    sys.path.insert(0, os.getcwd())  # as ``python -m`` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
