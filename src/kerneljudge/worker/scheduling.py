"""A confined worker's CPU scheduling is the supervisor's to set, not its own.

Loaded by path in the confined child before the package is imported, so it imports only the
standard library at its top.

Both workers are timed on the same reserved cores at the same priority; a candidate whose
worker could move itself to another core (``sched_setaffinity``) or raise its own priority
(``SCHED_FIFO`` or a negative nice value, which root's ``CAP_SYS_NICE`` allows) would run its
calls away from the load the reference's calls share the timing core with: on a 2-core host
with busy loops on both cores, a candidate that computes as the reference does was judged
`correct` at 2.1x with ``SCHED_FIFO``, and at 2.0x by moving itself to the other core while
three busy loops held the timing core.

* :func:`lock_scheduling` (the confined child, :mod:`kerneljudge.worker.confine`): a seccomp
  filter on the process and everything it starts that refuses, with ``EPERM``, the system
  calls that change a thread's scheduling: ``setpriority`` (``nice``), ``sched_setparam``,
  ``sched_setscheduler``, ``sched_setattr`` and ``sched_setaffinity``; system calls of another
  ABI (``int 0x80`` on x86-64, x32 numbers) are refused too, so that none of those reaches the
  kernel under another number. Reading them (``sched_getaffinity``, ``getpriority``) stays
  allowed.
* :func:`pin_tree` (the supervisor): since the worker can no longer pin itself for timing,
  the supervisor sets the affinity of every thread of its process tree from outside; threads
  started later inherit it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Iterable

__all__ = ["LOCKED_SYSCALLS", "lock_scheduling", "pin_tree", "seccomp_available"]

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_X32_SYSCALL_BIT = 0x40000000
# BPF instruction classes and modes (linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x05 | 0x10 | 0x00  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x05 | 0x30 | 0x00  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_NR_OFFSET, _ARCH_OFFSET = 0, 4  # struct seccomp_data

#: Per machine: the audit architecture of its native ABI and the numbers of the system calls
#: that change scheduling (setpriority, sched_setparam, sched_setscheduler,
#: sched_setaffinity, sched_setattr).
LOCKED_SYSCALLS: dict[str, tuple[int, tuple[int, ...]]] = {
    "x86_64": (0xC000003E, (141, 142, 144, 203, 314)),
    "aarch64": (0xC00000B7, (140, 118, 119, 122, 274)),
}


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_available() -> bool:
    """Whether this machine's kernel takes seccomp filters and :data:`LOCKED_SYSCALLS` knows
    its system call numbers (the ``Seccomp_filters`` line of ``/proc/self/status``)."""
    if platform.machine() not in LOCKED_SYSCALLS:
        return False
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp_filters:") for line in f)
    except OSError:
        return False


def _program(arch: int, numbers: Iterable[int], x32: bool) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions: a system call of another ABI refused,
    each of ``numbers`` refused, anything else allowed."""
    numbers = list(numbers)
    checks = ([(_JGE_K, _X32_SYSCALL_BIT)] if x32 else []) + [(_JEQ_K, nr) for nr in numbers]
    # 0 load arch, 1 native? skip 2, 2 deny, 3 load nr, checks..., allow, deny (the last)
    n = 4 + len(checks) + 2
    deny = n - 1
    prog = [(_LD_W_ABS, 0, 0, _ARCH_OFFSET), (_JEQ_K, 1, 0, arch)]
    prog += [(_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM), (_LD_W_ABS, 0, 0, _NR_OFFSET)]
    for code, k in checks:
        prog.append((code, deny - (len(prog) + 1), 0, k))
    prog += [(_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM)]
    assert len(prog) == n
    return prog


def lock_scheduling() -> bool:
    """Refuse, in this process and every thread and process it starts later, the system calls
    that change CPU scheduling (see the module's description). Sets ``no_new_privs``, which a
    filter needs without ``CAP_SYS_ADMIN``.

    Returns False, doing nothing, on a machine :data:`LOCKED_SYSCALLS` does not list.

    Raises:
        OSError: the kernel refused the filter.
    """
    machine = platform.machine()
    if machine not in LOCKED_SYSCALLS:
        return False
    arch, numbers = LOCKED_SYSCALLS[machine]
    prog = _program(arch, numbers, x32=machine == "x86_64")
    filters = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    fprog = _SockFprog(len(prog), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0):
        raise OSError(ctypes.get_errno(), "installing the scheduling filter failed")
    return True


def pin_tree(root: int, cpus: Iterable[int], passes: int = 20) -> bool:
    """Set the CPU affinity of every thread of process ``root`` and of its live descendants
    (host pids) to ``cpus``, again until a pass finds every thread already there (a thread
    started meanwhile inherits its creator's mask, which may not have been set yet).

    Returns whether the last pass found them all there (False also where a thread could not
    be set, or ``root`` has ended)."""
    from kerneljudge.worker.sandbox import child_pids  # (this module loads without the package)

    want = set(cpus)
    for _ in range(passes):
        changed = False
        for pid in [root, *child_pids(root)]:
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    if os.sched_getaffinity(int(task)) != want:
                        os.sched_setaffinity(int(task), want)
                        changed = True
                except OSError:
                    continue
        if not changed:
            return os.path.exists(f"/proc/{root}")
    return False
