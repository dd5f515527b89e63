"""Timed calls observed from outside the worker: kernel-stamped call boundaries, committed
digests, and audit choices and input seeds drawn by the supervisor.

Each worker gets one end of an ``AF_UNIX``/``SOCK_DGRAM`` socket pair; the supervisor keeps the
other with ``SO_TIMESTAMPNS`` set, so the kernel stamps every datagram the worker sends with the
time of the send (``CLOCK_REALTIME``, the clock of :func:`time.time_ns`), a clock no code in the
worker can reach. Per timed call ``i`` of a batch the worker's loop
(:func:`kerneljudge.worker.measure.time_calls`) sends:

* ``S`` right before its start mark and ``E`` right after its end mark, so the supervisor sees
  the window ``E_i - S_i`` that holds the reported time;
* ``C`` with the digests (:mod:`kerneljudge.worker.digest`) of copies of the outputs taken at the
  end mark: the worker is committed to them.

On ``E_i`` the supervisor answers ``N`` with the :func:`~kerneljudge.worker.measure.perturb` seed
of call ``i + 1``, drawn here: the worker learns a call's inputs only after the previous call's
window closed, so it cannot compute ahead inside a window. On ``C_i`` it answers ``K``: the audit
slot of call ``i`` (or -1), also drawn here, after the commit. The worker holds the copies of the
last few calls until their ``K`` arrives (it rarely waits: the answers travel while it copies,
digests and prepares the next call), then keeps or drops them; a GPU loop whose buffers would
take too much of the device holds none and waits for each ``K`` right after its commit
(:func:`kerneljudge.worker.measure.pipeline_depth`). The worker's time between calls is counted
from the latest of its commit and the sending of both answers, so that wait is not in it.

Datagrams carry a batch id; those of another batch are dropped on both sides. Layouts
(little-endian): ``S``/``E``: ``c I I`` (tag, batch, call); ``C``: ``c I I H`` + per output
``B 16s`` (digest kind, digest); ``N``: ``c I I Q`` (tag, batch, next call, its seed); ``K``:
``c I I h`` (tag, batch, call, slot).
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kerneljudge.worker.digest import digest as tree_digest
from kerneljudge.worker.sandbox import child_pids

__all__ = [
    "SO_TIMESTAMPNS",
    "BatchObservation",
    "CallRecord",
    "Observer",
    "output_digest",
    "process_cpu_ns",
    "tree_cpu_ns",
    "kernel_stamps",
    "socket_pair",
]

#: ``SO_TIMESTAMPNS`` on Linux (not exported by Python's socket module).
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
MARK = struct.Struct("<cII")
COMMIT_HEAD = struct.Struct("<cIIH")
COMMIT_ITEM = struct.Struct("<B16s")
SEED = struct.Struct("<cIIQ")
SLOT = struct.Struct("<cIIh")
#: Digest kinds: SHA-256 (first 16 bytes) of the bytes (CPU tensors), or the tree of torch
#: integer ops of :mod:`~kerneljudge.worker.digest` on the tensor's device (GPU tensors).
KIND_SHA256 = 1
KIND_TREE = 2
#: Device tensors up to this size are digested on the host (:func:`output_digest`).
HOST_DIGEST_BYTES = 4 << 20
#: Outputs per call a commit can describe.
MAX_OUTPUTS = 1024


def output_digest(t: torch.Tensor, kind: int | None = None) -> tuple[int, bytes]:
    """``(kind, 16 digest bytes)`` of a tensor's bytes (C order). ``kind`` None: SHA-256 for CPU
    tensors (torch's CPU int64 ops are slower than hashing) and for device tensors of at most
    :data:`HOST_DIGEST_BYTES` (one copy to the host costs less than the tree's few hundred
    kernel launches); the torch tree on the device for larger ones."""
    if kind is None:
        small = t.numel() * t.element_size() <= HOST_DIGEST_BYTES
        kind = KIND_SHA256 if t.device.type == "cpu" or small else KIND_TREE
    if kind == KIND_SHA256:
        flat = t.detach().contiguous().reshape(-1).cpu()
        # Hashed through the buffer protocol: no copy of the bytes (a 256 MiB output's copy
        # took 0.23 s on a 2-core host, more than the hash).
        data = flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")
        return kind, hashlib.sha256(data).digest()[:16]
    if kind == KIND_TREE:
        a, b = tree_digest(t)
        return kind, struct.pack("<QQ", a, b)
    raise ValueError(f"unknown digest kind {kind}")


@functools.cache
def kernel_stamps() -> bool:
    """Whether this kernel stamps ``AF_UNIX`` datagrams (``SO_TIMESTAMPNS``); some sandboxed
    kernels (gVisor) may not. Probed once per process with a throw-away socket pair."""
    sup, wrk = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        wrk.send(b"?")
        sup.settimeout(1.0)
        _, anc, _, _ = sup.recvmsg(8, socket.CMSG_SPACE(16))
        return any(lvl == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS for lvl, kind, _ in anc)
    except OSError:
        return False
    finally:
        sup.close()
        wrk.close()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """``(supervisor end, worker end)``: the supervisor's has kernel receive stamps on."""
    sup, wrk = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    sup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sup, wrk


@dataclass
class CallRecord:
    """What the supervisor saw of one call: kernel stamps (ns, ``CLOCK_REALTIME``) of its
    ``S``, ``E`` and ``C`` datagrams, the send times (the supervisor's own clock) of the next
    call's seed and of this call's audit slot, its committed digests, the slot it was kept in
    (-1: not) and its inputs' seed."""

    seed: int
    start_ns: int | None = None
    end_ns: int | None = None
    commit_ns: int | None = None
    next_seed_ns: int | None = None
    slot_ns: int | None = None
    digests: list[tuple[int, bytes]] | None = None
    slot: int = -1
    duplicate: bool = False


@dataclass
class BatchObservation:
    """The calls of one ``time`` request, by index (warm-up calls first)."""

    n: int
    warmup: int
    calls: dict[int, CallRecord] = field(default_factory=dict)
    junk: int = 0  # datagrams that fit no call of this batch
    #: False where the kernel does not stamp datagrams: the times are the supervisor's receipt
    #: times, which hold its own latency, and say nothing about the windows.
    stamped: bool = True
    #: The kernel's count of the CPU time the worker's process tree used (ns) from right before
    #: the request was sent (``request_ns``, ``CLOCK_REALTIME``) to right after its reply came
    #: (``reply_ns``); None where it could not be read.
    cpu_ns: int | None = None
    request_ns: int | None = None
    reply_ns: int | None = None

    def complete(self) -> bool:
        """Whether every call was seen whole, once: ``S``, ``E`` and ``C``, in that order."""
        total = self.n + self.warmup
        if self.junk or len(self.calls) != total:
            return False
        for rec in self.calls.values():
            start, end, commit = rec.start_ns, rec.end_ns, rec.commit_ns
            if rec.duplicate or start is None or end is None or commit is None:
                return False
            if not start <= end <= commit:
                return False
        return True


def process_cpu_ns(pid: int) -> int | None:
    """CPU time (ns) all threads of process ``pid`` used so far, ended ones included, by the
    kernel's count: its process CPU clock (``clock_gettime`` on the clock id
    ``(~pid << 3) | 2``, ``CPUCLOCK_SCHED`` of the pid, as ``clock_getcpuclockid`` makes it),
    which Linux lets any process read. None where it cannot be read."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        return None


_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def tree_cpu_ns(root: int) -> int | None:
    """CPU time (ns) used so far by process ``root`` and every live descendant, plus what
    their children that ended and were reaped had used (``cutime + cstime`` of
    ``/proc/PID/stat``, in clock ticks of ``1 / SC_CLK_TCK`` s). Work handed to another process
    of the tree is counted wherever it runs. None where ``root`` cannot be read."""
    total = process_cpu_ns(root)
    if total is None:
        return None
    for pid in [root, *child_pids(root)]:
        if pid != root:
            total += process_cpu_ns(pid) or 0
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[13]) + int(fields[14])) * _TICK_NS  # cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return total


class Observer:
    """The supervisor's end of one worker's stamp socket.

    :meth:`run` sends a ``time`` request and, on a thread, receives the worker's datagrams while
    the batch runs, answering each commit with the audit choice of ``keep`` and the next seed.
    That thread runs off the CPU cores in ``avoid_cpus`` (the timed worker's), where it has
    others: woken there by a datagram, it would take the core from the worker it observes.
    """

    def __init__(self, sock: socket.socket, avoid_cpus: Iterable[int] = ()) -> None:
        self.sock = sock
        self.avoid_cpus = frozenset(avoid_cpus)

    def _drain_stale(self) -> None:
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass

    def run(
        self,
        request: Callable[..., dict[str, Any]],
        timeout_s: float,
        *,
        n: int,
        warmup: int,
        keep: Callable[[int], int],
        cpu_root: int | None = None,
        **fields: Any,
    ) -> tuple[dict[str, Any], BatchObservation]:
        """Send ``request("time", timeout_s, n=n, warmup=warmup, link=..., **fields)`` and
        observe its calls. ``keep(i)`` (timed call index from 0) returns the slot call ``i``
        is kept in, or -1; it is asked only after the call's commit arrived. Each next call's
        seed is drawn when the previous call's ``E`` arrives. ``cpu_root``: the host pid at the
        root of the worker's process tree, whose CPU time (:func:`tree_cpu_ns`) over the request
        is read into the observation's ``cpu_ns``.

        Returns the reply and the observation; exceptions of ``request`` propagate.
        """
        self._drain_stale()
        batch = secrets.randbits(32)
        obs = BatchObservation(n, warmup, stamped=kernel_stamps())
        total = n + warmup
        seeds = [secrets.randbits(62)]
        obs.calls[0] = CallRecord(seeds[0])

        def send(data: bytes) -> None:
            try:
                self.sock.send(data)
            except OSError:
                obs.junk += 1

        def on_datagram(data: bytes, stamp: int | None) -> None:
            tag = data[:1]
            if tag in (b"S", b"E") and len(data) == MARK.size:
                _, b, i = MARK.unpack(data)
                rec = obs.calls.get(i) if b == batch else None
                if rec is None or stamp is None:
                    obs.junk += 1
                    return
                attr = "start_ns" if tag == b"S" else "end_ns"
                if getattr(rec, attr) is not None:
                    rec.duplicate = True
                    return
                setattr(rec, attr, stamp)
                if tag == b"E" and i + 1 < total:
                    nxt = secrets.randbits(62)
                    obs.calls[i + 1] = CallRecord(nxt)
                    rec.next_seed_ns = time.time_ns()
                    send(SEED.pack(b"N", batch, i + 1, nxt))
                return
            if tag == b"C" and len(data) >= COMMIT_HEAD.size:
                _, b, i, k = COMMIT_HEAD.unpack_from(data)
                rec = obs.calls.get(i) if b == batch else None
                if rec is None or stamp is None or rec.commit_ns is not None:
                    obs.junk += 1
                    return
                if len(data) != COMMIT_HEAD.size + k * COMMIT_ITEM.size or k > MAX_OUTPUTS:
                    obs.junk += 1
                    return
                rec.commit_ns = stamp
                rec.digests = [
                    COMMIT_ITEM.unpack_from(data, COMMIT_HEAD.size + j * COMMIT_ITEM.size)
                    for j in range(k)
                ]
                rec.slot = keep(i - warmup) if i >= warmup else -1
                rec.slot_ns = time.time_ns()
                send(SLOT.pack(b"K", batch, i, rec.slot))
                return
            obs.junk += 1

        def receive() -> None:
            others = os.sched_getaffinity(0) - self.avoid_cpus
            if others and self.avoid_cpus:
                os.sched_setaffinity(0, others)  # this thread only (Linux)
            space = socket.CMSG_SPACE(16)
            self.sock.setblocking(False)
            listened = self.sock.fileno()
            poller = select.poll()  # (select.select refuses descriptors past 1023)
            poller.register(listened, select.POLLIN)
            poller.register(woken, select.POLLIN)
            while True:
                # The socket first: a wake-up (the reply came) ends the thread only once
                # every datagram sent before the reply has been read.
                try:
                    ready = {fd for fd, _ in poller.poll()}
                except OSError:
                    return
                if listened not in ready:
                    return
                try:
                    data, anc, _, _ = self.sock.recvmsg(
                        COMMIT_HEAD.size + MAX_OUTPUTS * COMMIT_ITEM.size + 1, space
                    )
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return
                stamp = None
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(raw) >= 16:
                        sec, nsec = struct.unpack_from("qq", raw)
                        stamp = sec * 1_000_000_000 + nsec
                if stamp is None and not obs.stamped:
                    stamp = time.time_ns()
                on_datagram(data, stamp)

        woken, wake = os.pipe()
        thread = threading.Thread(target=receive, name="kj-stamps", daemon=True)
        thread.start()
        cpu0 = tree_cpu_ns(cpu_root) if cpu_root is not None else None
        obs.request_ns = time.time_ns()
        try:
            reply = request(
                "time",
                timeout_s,
                n=n,
                warmup=warmup,
                link={"batch": batch, "seed": seeds[0]},
                **fields,
            )
        finally:
            obs.reply_ns = time.time_ns()
            cpu1 = tree_cpu_ns(cpu_root) if cpu_root is not None else None
            if cpu0 is not None and cpu1 is not None:
                obs.cpu_ns = cpu1 - cpu0
            os.write(wake, b"x")
            thread.join()
            os.close(woken)
            os.close(wake)
        return reply, obs


class Reservoir:
    """Uniform sample of ``size`` timed calls over every call offered (reservoir sampling):
    :meth:`offer` returns the slot the ``m``-th call goes to, or -1, from this process's
    entropy. ``kept[slot]`` is whatever the caller stores with the slot."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.seen = 0
        self.kept: dict[int, Any] = {}

    def offer(self) -> int:
        self.seen += 1
        if self.seen <= self.size:
            return self.seen - 1
        j = secrets.randbelow(self.seen)
        return j if j < self.size else -1
