"""Confinement of candidate code inside its worker process (the second line of defence).

The first line is the process boundary itself: the candidate never shares a process with the
judge, the reference, the seed or the comparison, and the kernel confines that process and all
it starts (PID, network and mount namespaces, Landlock: :mod:`kerneljudge.worker.confine`).
Inside its worker, while candidate code runs:

* a PEP 578 audit hook refuses network sockets, process creation (other than the compiler tools
  that ``load_inline``, Triton and ``torch.compile`` call, and TorchInductor's library-loading
  probe, see :func:`library_probe` and :data:`INDUCTOR_IN_PROCESS`), writes outside the
  worker's scratch and cache folders (names relative to a directory fd judged where they lead;
  under ``/dev`` only :data:`WRITABLE_DEVICES`; its own ``/proc/<pid>/`` entries too), reads
  of other processes' ``/proc`` entries, signals to other processes, further audit hooks, and
  ctypes look-ups of the C functions in :data:`DENIED_SYMBOLS`. A refusal raises
  ``PermissionError`` in the candidate and is recorded, so the verdict says what was
  attempted. Audit hooks cannot be removed from Python once added; native code (a C++
  extension calling ``connect`` directly) is not seen by them, see ``docs/security.md``;
* resource limits: output files (the log that receives stdout/stderr) are capped by
  ``RLIMIT_FSIZE``; orphaned grandchildren are re-parented to the worker
  (``PR_SET_CHILD_SUBREAPER``) so the supervisor can find and kill them;
* after each call, Python threads and child processes that outlive it are reported.
"""

from __future__ import annotations

import ast
import ctypes
import fnmatch
import os
import resource
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from kerneljudge.worker.environment import INDUCTOR_IN_PROCESS, candidate_environment
from kerneljudge.worker.threads import lingering_threads, thread_idents

__all__ = [
    "COMPILER_TOOLS",
    "INDUCTOR_IN_PROCESS",
    "LAUNCH_WAIT_S",
    "LOG_LIMIT_BYTES",
    "Sandbox",
    "candidate_environment",
    "child_pids",
    "launching_children",
    "library_probe",
    "lingering_threads",
    "set_subreaper",
    "set_undumpable",
    "thread_idents",
    "wait_launched",
]

#: Largest log (stdout + stderr) a candidate worker may write; beyond it the worker gets SIGXFSZ.
LOG_LIMIT_BYTES = 16 << 20
#: Executables the candidate's build machinery may start at run time (Triton's JIT, ninja's
#: up-to-date check when ``load_inline`` reloads a cached build).
COMPILER_TOOLS = frozenset(
    {
        "ninja",
        "c++",
        "g++",
        "gcc",
        "cc",
        "clang",
        "clang++",
        "nvcc",
        "ptxas",
        "ld",
        "ld.gold",
        "nvlink",
        "fatbinary",
        "cudafe++",
        "cicc",
        "nvdisasm",
        "cuobjdump",
        "which",
        "uname",
        "ldconfig",
        "ldconfig.real",
    }
)
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
#: Audit events that change the file system: (index of a path argument, index of the argument
#: giving the directory fd it is relative to, or None), per path argument.
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.rename": ((0, 2), (1, 3)),
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.symlink": ((0, 2), (1, 2)),
    "os.link": ((0, 2), (1, 3)),
    "os.truncate": ((0, None),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "shutil.rmtree": ((0, 1),),
}
#: Device files candidate code may open for writing (``fnmatch`` patterns of real paths).
WRITABLE_DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/nvidia*",
    "/dev/nvidia-caps/*",
    "/dev/dri/*",
)
#: ``/proc`` files of the system, not of a process, that candidate code may read.
_PROC_SYSTEM = ("/proc/cpuinfo", "/proc/meminfo", "/proc/sys/", "/proc/driver/")
#: C functions a candidate may not look up through ctypes while it runs: the powers the audit
#: hook refuses to Python code (signals, tracing, processes, sockets, limits). File functions
#: are not on the list: CUDA and profiling libraries look them up through ctypes themselves.
DENIED_SYMBOLS = frozenset(
    {
        "kill",
        "tgkill",
        "tkill",
        "killpg",
        "sigqueue",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "fork",
        "vfork",
        "clone",
        "clone3",
        "execve",
        "execv",
        "execvp",
        "execvpe",
        "execl",
        "execlp",
        "system",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "socket",
        "connect",
        "bind",
        "sendto",
        "sendmsg",
        "open",
        "open64",
        "openat",
        "openat64",
        "fopen",
        "fopen64",
        "creat",
        "unlink",
        "unlinkat",
        "rename",
        "prctl",
        "setrlimit",
        "prlimit",
        "prlimit64",
        "syscall",
        "dlopen",
        "signal",
        "sigaction",
    }
)


def set_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux; no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_undumpable() -> None:
    """Make this process's memory unreadable through ``/proc/<pid>/mem`` and ptrace for other
    processes of the same (non-root) user (``PR_SET_DUMPABLE`` 0; no-op off Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def limit_output(limit_bytes: int = LOG_LIMIT_BYTES) -> None:
    """Cap the size of files this process writes (its stdout/stderr log among them)."""
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    except (ValueError, OSError):
        pass


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (of each of its threads), read from ``/proc``."""
    kids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return kids
    for task in tasks:
        try:
            kids.extend(int(k) for k in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return kids


def child_pids(pid: int) -> list[int]:
    """All live descendants of ``pid`` (children first), read from ``/proc``."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        kids = _children(frontier.pop())
        for k in kids:
            if k not in out:
                out.append(k)
                frontier.append(k)
    return out


#: What a worker's launcher runs before the worker's Python (``confine.command``).
_LAUNCHERS = frozenset({"unshare", "setpriv"})
#: Longest :func:`wait_launched` waits (seconds).
LAUNCH_WAIT_S = 0.5


def launching_children(pid: int) -> set[int]:
    """The children of launcher ``pid`` still running a launcher's code (forked by ``unshare
    --fork``, not yet running the worker's Python), by their names in ``/proc``."""
    out: set[int] = set()
    for kid in _children(pid):
        try:
            if Path(f"/proc/{kid}/comm").read_text().strip() in _LAUNCHERS:
                out.add(kid)
        except OSError:
            continue
    return out


def wait_launched(pid: int, timeout_s: float = LAUNCH_WAIT_S) -> set[int]:
    """Wait, at most ``timeout_s``, until no child of launcher ``pid`` runs a launcher's code
    (:func:`launching_children`); returns those that still do."""
    deadline = time.monotonic() + timeout_s
    while (left := launching_children(pid)) and time.monotonic() < deadline:
        time.sleep(0.005)
    return left


def pause_tree(pid: int, paused: bool, launched: bool) -> None:
    """Stop (``SIGSTOP``) or continue (``SIGCONT``) launcher ``pid`` and its descendants. Unless
    ``launched`` (its child is known to run Python), a stop first waits for the child to leave
    the launcher's code (:func:`wait_launched`) and spares one that has not: stopped before it
    arms its parent-death signal, it would outlive a supervisor killed meanwhile."""
    sig = signal.SIGSTOP if paused else signal.SIGCONT
    left = wait_launched(pid) if paused and not launched else set()
    for each in [p for p in [pid, *child_pids(pid)] if p not in left]:
        try:
            os.kill(each, sig)
        except (ProcessLookupError, PermissionError):
            pass


#: Names a library-loading probe may import (``from ctypes import cdll``, ``import sys``, ...).
_PROBE_IMPORTS = frozenset({"sys", "torch", "ctypes"})
#: Syntax a library-loading probe may use besides its imports and ``cdll.LoadLibrary`` calls.
_PROBE_NODES = (
    ast.Module,
    ast.Expr,
    ast.If,
    ast.Try,
    ast.ExceptHandler,
    ast.Raise,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Attribute,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.alias,
)


def library_probe(argv: list[str]) -> bool:
    """Whether ``argv`` is this Python interpreter run as ``python -c SCRIPT`` where ``SCRIPT``
    does nothing but import ``sys``/``torch``/``ctypes.cdll``, test ``sys.platform``, and load
    libraries named by string literals with ``cdll.LoadLibrary``: TorchInductor's check that a
    library built for a CPU vector instruction set loads (``torch._inductor.cpu_vec_isa``).

    Loading a library runs native code, which a candidate may already run in its own process
    (``load_inline``); the child adds no power beyond that. The script is read from ``argv``
    itself, never from the candidate's (changeable) copy of torch's template.
    """
    if len(argv) != 3 or argv[1] != "-c" or not isinstance(argv[2], str):
        return False
    if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return False
    try:
        tree = ast.parse(argv[2])
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(a.name not in _PROBE_IMPORTS or a.asname for a in node.names):
                return False
        elif isinstance(node, ast.ImportFrom):
            if node.module != "ctypes" or [(a.name, a.asname) for a in node.names] != [
                ("cdll", None)
            ]:
                return False
        elif isinstance(node, ast.Call):
            func = node.func
            if not (
                isinstance(func, ast.Attribute)
                and func.attr == "LoadLibrary"
                and isinstance(func.value, ast.Name)
                and func.value.id == "cdll"
                and not node.keywords
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                return False
        elif isinstance(node, ast.Attribute):
            if node.attr not in ("platform", "LoadLibrary"):
                return False
        elif isinstance(node, ast.Name):
            if node.id not in ("sys", "cdll", "OSError"):
                return False
        elif not isinstance(node, _PROBE_NODES):
            return False
    return True


class Sandbox:
    """The audit-hook policy of one worker.

    Args:
        writable: folders (and their subtrees) the candidate may write to.
    """

    def __init__(self, writable: Iterable[str | os.PathLike[str]]) -> None:
        self.writable = [os.path.realpath(p) for p in writable]
        self.armed = False
        self.violations: list[str] = []
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            sys.addaudithook(self._hook)
            self._installed = True

    def allow_writes_to(self, path: str | os.PathLike[str]) -> None:
        self.writable.append(os.path.realpath(path))

    def take_violations(self) -> list[str]:
        out, self.violations = self.violations, []
        return out

    # ------------------------------------------------------------------ policy
    def _refuse(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(f"kerneljudge sandbox: {what} is not allowed")

    def _may_write(self, path: str) -> bool:
        real = os.path.realpath(path)
        if real.startswith("/dev/"):
            return any(fnmatch.fnmatchcase(real, pattern) for pattern in WRITABLE_DEVICES)
        if real.startswith(f"/proc/{os.getpid()}/"):
            return True
        return any(real == w or real.startswith(w + os.sep) for w in self.writable)

    def _other_process(self, path: str) -> bool:
        """``path`` (absolute) names another process's ``/proc`` entry, through whatever
        symlinks (``/proc/self/root/proc/N``, ``/proc/self/../N``)."""
        if not path.startswith("/proc") and "/proc" not in path:
            return False
        real = os.path.realpath(path)
        if not real.startswith("/proc/") or real.startswith(_PROC_SYSTEM):
            return False
        pid = real.split("/")[2]
        return pid.isdigit() and int(pid) != os.getpid()

    def _trusted_tool(self, path: str) -> bool:
        """A compiler tool by name, installed outside every folder the candidate may write."""
        if os.path.basename(path) not in COMPILER_TOOLS:
            return False
        if os.sep in path:
            real = os.path.realpath(path)
        else:
            import shutil

            found = shutil.which(path)
            real = os.path.realpath(found) if found else ""
        return bool(real) and not self._may_write(real)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if not self.armed:
            return
        if event == "open":
            path, mode = args[0], args[1]
            if not isinstance(path, (str, bytes)):
                return  # a file descriptor
            p = os.fsdecode(path)
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                writing = True
            # ``os.open(name, dir_fd=fd)`` reports only the name: a relative name may be
            # relative to any directory this process holds open, so every such reading counts.
            for full in resolutions(p, None):
                if writing and not self._may_write(full):
                    self._refuse(f"writing {full} (outside the scratch folder)")
                if self._other_process(full):
                    self._refuse(f"reading {full} (another process)")
        elif event in _PATH_EVENTS:
            for index, fd_index in _PATH_EVENTS[event]:
                if index >= len(args):
                    continue
                arg = args[index]
                dir_fd = args[fd_index] if fd_index is not None and fd_index < len(args) else None
                if not isinstance(arg, (str, bytes, os.PathLike)):
                    continue
                for full in resolutions(os.fsdecode(arg), dir_fd):
                    if not self._may_write(full):
                        self._refuse(f"changing {full} (outside the scratch folder)")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            address = args[1] if len(args) > 1 else "?"
            self._refuse(f"opening a network connection ({event} {address})")
        elif event == "socket.__new__":
            family = args[1] if len(args) > 1 else None
            if family not in (getattr(__import__("socket"), "AF_UNIX", 1),):
                self._refuse("creating a network socket")
        elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn"):
            exe = args[0] if args else ""
            if exe is None and len(args) > 1 and isinstance(args[1], (list, tuple)) and args[1]:
                exe = args[1][0]
            path = os.fsdecode(exe) if isinstance(exe, (str, bytes, os.PathLike)) else ""
            argv = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
            probe = event == "subprocess.Popen" and library_probe(
                [os.fsdecode(a) if isinstance(a, (str, bytes)) else a for a in argv]
            )
            if not probe and not self._trusted_tool(path):
                self._refuse(f"starting a process ({os.path.basename(path) or exe})")
        elif event in ("os.fork", "os.forkpty", "os.system"):
            self._refuse(f"starting a process ({event})")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0] if args else None
            if isinstance(pid, int) and pid != os.getpid():
                self._refuse(f"signalling process {pid}")
        elif event in ("os.pidfd_open",) or event.startswith("signal.pidfd"):
            self._refuse("signalling another process")
        elif event == "sys.addaudithook":
            self._refuse("adding an audit hook")
        elif event == "ctypes.dlsym":
            name = args[1] if len(args) > 1 else ""
            if isinstance(name, str) and name.lstrip("_").removesuffix("64") in DENIED_SYMBOLS:
                self._refuse(f"calling the C function {name} through ctypes")


def resolutions(path: str, dir_fd: object) -> list[str]:
    """The absolute paths a file name may mean: itself when absolute; relative to ``dir_fd``
    (read from ``/proc/self/fd``) when one is given; else relative to the working directory
    and to every directory this process holds open (an ``open`` audit event does not say
    whether ``dir_fd`` was used)."""
    if os.path.isabs(path):
        return [path]
    if isinstance(dir_fd, int) and dir_fd >= 0:
        try:
            return [os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)]
        except OSError:
            return [path]
    out = [os.path.join(os.getcwd(), path)]
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and os.path.isdir(target):
            out.append(os.path.join(target, path))
    return out
