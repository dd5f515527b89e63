"""The timed loop run inside a worker, identical for the reference and the candidate.

Per call, outside the timed window: new inputs made from one of the input sets (rotating) by
:func:`perturb` (:mod:`kerneljudge.worker.perturbation`) under a per-call seed: each continuous
floating input with no structure gets the slices along one dimension (the first with 8 or more,
else the longest) put in a random order, those along its last dimension rolled, and one
element nudged by one unit in the last place; an input whose values are triangular, symmetric or
sorted keeps those dimensions in order and is not nudged, reordered along its other dimensions
and, where none has 8 slices, changed in a way that keeps its structure (rows and columns of a
triangular matrix scaled, a symmetric one's by one set of factors, else one factor for all); inputs
whose values are all integers, such as masks and ids, are copied unchanged. So calls do not
see the same content (short of a chance repeat among the orders and nudges or factors a set
allows) and a result cached on content, shape or address is the answer to other inputs.
Also outside the window: freed memory poisoned with NaN bit patterns (so that an output the
call did not write is wrong), and the L2 cache flushed by writing a buffer twice its size.
Inside the window: the call, then a device-wide synchronisation, so work left on any stream
is counted.

In a verdict the loop is observed through the worker's stamp socket
(:mod:`kerneljudge.worker.stamps`): a datagram right before the start mark and one right after
the end mark (the kernel stamps both), then the digests of copies of the outputs taken at the
end mark; the supervisor answers with the next call's seed (drawn once the window closed) and
whether this call is kept for the audit (drawn after the commit). A Python thread started by the
call and still alive at the end mark fails the call at once.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.worker.perturbation import (
    CONTINUOUS_BLOCK,
    PERMUTED_ROWS_MAX,
    Plan,
    continuous,
    nudge,
    perturb,
    plans,
    writable,
)
from kerneljudge.worker.sandbox import thread_idents
from kerneljudge.worker.stamps import (
    COMMIT_HEAD,
    COMMIT_ITEM,
    MARK,
    MAX_OUTPUTS,
    SEED,
    SLOT,
    output_digest,
)

# The input perturbation is defined in kerneljudge.worker.perturbation, and named here too.
__all__ = ["CONTINUOUS_BLOCK", "PERMUTED_ROWS_MAX", "Link", "Plan", "ThreadLeftRunning",
           "continuous", "flatten_tensors", "load_static", "nudge", "perturb",
           "pipeline_depth", "plans", "poison", "time_calls", "unwritten",
           "writable"]  # fmt: skip

# Captured when the worker starts, before candidate code can patch them: the C-level event
# methods cannot be replaced from Python, and a later patch of the Python names does not reach
# these references. The events go on the current stream; the device-wide synchronisations on
# both sides make the interval cover work on every stream.
_synchronize = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_Event = torch.cuda.Event
_record = torch._C._CudaEventBase.record
_elapsed = torch._C._CudaEventBase.elapsed_time
_event_sync = torch._C._CudaEventBase.synchronize
_perf_counter_ns = time.perf_counter_ns
_process_time_ns = time.process_time_ns
# The C-level functions, not torch.cuda's Python wrappers: those look their target up at each
# call and run replay hooks (torch.cuda.graphs.register_graph_replay_start_hook), both of
# which candidate code could point at its own work inside a replay's window.
_sleep_cycles = torch._C._cuda_sleep
_graph_replay = torch._C._CUDAGraph.replay
_copy = torch.Tensor.copy_
_fill = torch.Tensor.fill_
_randbits = secrets.randbits
_send = socket.socket.send
_recv = socket.socket.recv
_DONTWAIT = socket.MSG_DONTWAIT
#: How long a GPU worker polls for the supervisor's answer before it sleeps on the socket (ns).
SPIN_NS = 50_000_000
_thread_idents = thread_idents
_output_digest = output_digest
_MARK, _HEAD, _ITEM, _SEED, _SLOT = MARK, COMMIT_HEAD, COMMIT_ITEM, SEED, SLOT
_MAX_OUTPUTS = MAX_OUTPUTS
#: Committed calls whose outputs the loop holds while their audit slot is on its way.
PIPELINE_DEPTH = 2
#: The share of a GPU's memory one worker's timed loop may take for a call's own buffers before
#: it holds no committed call's outputs while their slot is on its way (:func:`pipeline_depth`):
#: the other worker holds what it keeps on the device meanwhile (its input sets; the reference
#: its trials, up to a quarter of the device,
#: :data:`kerneljudge.worker.kept_trials.KEEP_DEVICE_SHARE`; the candidate its audited calls'
#: outputs, :data:`SNAPSHOT_DEVICE_SHARE`).
LOOP_DEVICE_SHARE = 1 / 4
#: The share of a GPU's memory the kept outputs of audited calls may take there; the ones past
#: it are copied to the host when their slot arrives (between calls, outside any window). The
#: supervisor sizes the number of audited calls to the same share
#: (:data:`kerneljudge.timing.stage.AUDIT_KEEP_SHARE`; at least two calls, which may exceed it
#: where an output takes more than a sixteenth of the device), so they stay on the device: a
#: 6 GiB output's copy into pageable host memory took 4.7 s on the H200
#: (``benchmarks/timed_loop_steps.py``); those past it go to page-locked memory
#: (:func:`_host_copies`).
SNAPSHOT_DEVICE_SHARE = 1 / 8
#: GPU clock cycles the device spins before a replay's start event (10-20 us at 1-2 GHz): the
#: host has the graph's launch queued by then, so its host latency is not in the replay's time.
#: Short, since it lies inside the stamped window of both sides and follows the SM clock.
REPLAY_LEAD_CYCLES = 20_000


def pipeline_depth(
    input_bytes: int, output_bytes: int, device_bytes: int, static_bytes: int = 0
) -> int:
    """How many committed calls' output copies a GPU worker's timed loop holds while their
    audit slots are on their way: :data:`PIPELINE_DEPTH`, or 0 (each call's slot waited for
    right after its commit, a round trip to the supervisor between calls) where a call's own
    buffers with them, ``2 * input_bytes + static_bytes + (2 + PIPELINE_DEPTH) *
    output_bytes`` (the largest input set and its perturbed copy, a captured graph's static
    inputs and outputs, the outputs and their copy, the held copies), would take more than
    :data:`LOOP_DEVICE_SHARE` of ``device_bytes``. Read from sizes alone, the same on both
    sides of a timing where the candidate's outputs are the reference's sizes on the device;
    the supervisor counts neither wait in a worker's time between calls
    (:func:`kerneljudge.timing.sampling.observed`).

    On an 80 GiB device, a 6 GiB input and output: 36 GiB with the held copies, 24 GiB without;
    with them the reference's timed calls peaked at 43 GiB, and one ran out of memory beside
    what the candidate's worker held."""
    need = 2 * input_bytes + static_bytes + (2 + PIPELINE_DEPTH) * output_bytes
    return PIPELINE_DEPTH if need <= LOOP_DEVICE_SHARE * device_bytes else 0


def _device_bytes(tensors: Any) -> int:
    """Bytes of the GPU tensors in ``tensors`` (nested lists and tuples)."""
    return sum(t.numel() * t.element_size() for t in flatten_tensors(tensors) if t.is_cuda)


def _end_copies(outputs: list[torch.Tensor], reuse: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of a call's ``outputs`` taken at its end mark: written into ``reuse`` (an
    earlier call's copies, one buffer per output) when every output is a plain tensor of its
    buffer's shape, strides, dtype and device (the buffers are clones, so dense: an output
    with those strides is written whole); else, all of them, new clones."""
    if len(reuse) == len(outputs) and all(map(_fits, reuse, outputs)):
        return [_copy(b, t.detach()) for b, t in zip(reuse, outputs)]
    return [t.detach().clone() for t in outputs]


def _fits(buffer: torch.Tensor, t: torch.Tensor) -> bool:
    return (
        type(t) is torch.Tensor
        and type(buffer) is torch.Tensor
        and t.layout == torch.strided
        and not (t.is_quantized or t.is_conj() or t.is_neg())
        and (buffer.shape, buffer.stride(), buffer.dtype, buffer.device)
        == (t.shape, t.stride(), t.dtype, t.device)
    )


def _host_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Host copies of a kept call's outputs (:func:`kerneljudge.worker.forward.to_cpu`): those
    of 1 MiB or more in page-locked memory where it can be had (torch's caching host allocator,
    which rounds a block up to a power of two and keeps it until the worker exits: a 6 GiB
    output holds 8 GiB), the rest pageable. A 6 GiB output's copy into fresh pageable memory
    took 4.5-4.7 s on the H200
    (docs/benchmarks/2026-12-04-h200-timed-loop-at-gib-sizes.md)."""
    from kerneljudge.worker.forward import to_cpu  # (forward imports this module)

    return [to_cpu(t) for t in tensors]


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def poison(nbytes: int, device: torch.device) -> None:
    """Fill ``nbytes`` of freshly allocated, then freed, memory with 0xFF (NaN in every float
    format), so that a later ``torch.empty`` that reuses it does not hold stale results."""
    if nbytes > 0:
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.fill_(0xFF)
        del block


def unwritten(t: torch.Tensor) -> float | int | bool:
    """What a graph's static output is filled with before a replay: NaN for floating and
    complex tensors, the largest value for unsigned integers, -1 for signed ones, True for
    bool, so that an element the replay does not write differs from any honest NaN-free
    result of a float problem and stands out in an integer one."""
    if t.is_floating_point() or t.is_complex():
        return float("nan")
    if t.dtype == torch.bool:
        return True
    info = torch.iinfo(t.dtype)
    return -1 if info.min < 0 else info.max


def load_static(static_args: list[Any], outputs: list[torch.Tensor], args: list[Any]) -> None:
    """Before a graph replay: fill its static outputs with :func:`unwritten` values (an output
    the replay does not write is wrong), then copy ``args`` into its static inputs (tensors
    only; an output that aliases an input is restored by the copy)."""
    for t in outputs:
        _fill(t, unwritten(t))
    for static, x in zip(static_args, args):
        if isinstance(static, torch.Tensor):
            _copy(static, x)


class ThreadLeftRunning(Exception):
    """A Python thread started during a timed call was still alive at its end mark."""


class Link:
    """The worker's end of the stamp socket (:mod:`kerneljudge.worker.stamps`) for one batch:
    sends the ``S``/``E`` marks and the ``C`` commits, reads the ``N`` seeds and ``K`` slots."""

    def __init__(self, sock: socket.socket, batch: int, spin_ns: int = 0) -> None:
        self.sock = sock
        self.batch = batch
        self.spin_ns = spin_ns
        self.seeds: dict[int, int] = {}
        self.slots: dict[int, int] = {}
        #: CPU time (ms) this process used from each call's end mark to the next call's start
        #: mark, waits for the supervisor included (a CPU worker sleeps through them).
        self.between_cpu_ms: list[float] = []

    def mark(self, tag: bytes, i: int) -> None:
        _send(self.sock, _MARK.pack(tag, self.batch, i))

    def commit(self, i: int, digests: list[tuple[int, bytes]]) -> None:
        items = b"".join(_ITEM.pack(kind, d) for kind, d in digests)
        _send(self.sock, _HEAD.pack(b"C", self.batch, i, len(digests)) + items)

    def _read(self) -> None:
        # Polled without sleeping for up to spin_ns, then blocking. A worker that sleeps while
        # the answer travels waits, once woken, for its turn on a busy core (a scheduler slice,
        # milliseconds, longer the more CPU its calls used), and that wait lands in the time
        # between its timed calls that the supervisor measures; one that polls spends CPU time
        # there, which the supervisor counts on the CPU (timer_rule). GPU workers poll, CPU
        # workers sleep.
        deadline = _perf_counter_ns() + self.spin_ns
        while True:
            try:
                data = _recv(self.sock, 64, _DONTWAIT)
                break
            except BlockingIOError:
                if _perf_counter_ns() > deadline:
                    data = _recv(self.sock, 64)
                    break
        if len(data) == _SEED.size and data[:1] == b"N":
            _, batch, i, seed = _SEED.unpack(data)
            if batch == self.batch:
                self.seeds[i] = seed
        elif len(data) == _SLOT.size and data[:1] == b"K":
            _, batch, i, slot = _SLOT.unpack(data)
            if batch == self.batch:
                self.slots[i] = slot

    def seed(self, i: int) -> int:
        """The seed of call ``i`` (blocks until the supervisor sent it)."""
        while i not in self.seeds:
            self._read()
        return self.seeds.pop(i)

    def slot(self, i: int) -> int:
        """The audit slot of call ``i``, -1 for none (blocks until the supervisor sent it)."""
        while i not in self.slots:
            self._read()
        return self.slots.pop(i)


def time_calls(
    fn: Callable[..., Any],
    input_sets: list[list[Any]],
    *,
    n: int,
    warmup: int,
    device: torch.device,
    flush: torch.Tensor | None,
    poison_bytes: int,
    nudgeable: list[list[Plan | None]] | None = None,
    check_call: Callable[[Any], None] | None = None,
    roll: bool = True,
    link: Link | None = None,
    seed: int | None = None,
    threads_before: set[int] | None = None,
    reject_threads: bool = True,
    graph: Any = None,
    kept_before: dict[int, Any] | None = None,
    recycle: bool | None = None,
) -> tuple[list[float], dict[int, list[torch.Tensor]], float]:
    """Time ``n`` calls of ``fn`` (after ``warmup`` untimed ones), rotating over ``input_sets``.

    Args:
        fn: the model (or compiled model) to call under ``torch.no_grad()``.
        input_sets: one or more argument lists, already on ``device``.
        n, warmup: timed and untimed calls.
        device: where the calls run; CUDA events time them on a GPU, ``perf_counter_ns`` on CPU.
        flush: a buffer larger than the L2 cache, rewritten before each call (None on CPU).
        poison_bytes: how much freed memory to poison before each call.
        nudgeable: per set, how :func:`perturb` changes each argument (a
            :class:`~kerneljudge.worker.perturbation.Plan`, None for unchanged); None: decided
            here (:func:`~kerneljudge.worker.perturbation.plans`).
        check_call: called with each output right after its end mark (may raise).
        roll: passed to :func:`perturb`.
        link: the stamp socket of the batch (see :mod:`kerneljudge.worker.stamps`): each
            call's window is marked on it, its outputs' digests committed, its seed read from
            the supervisor (sent when the previous call's window closed) and its audit slot
            read after the commit (up to ``PIPELINE_DEPTH`` calls later, or at once on a GPU
            where :func:`pipeline_depth` says so). None: seeds from
            this process's entropy, nothing marked or kept (for use outside a verdict).
        seed: the first call's :func:`perturb` seed (with ``link``).
        threads_before: Python threads that may be alive at an end mark (None: not checked);
            any other raises :class:`ThreadLeftRunning` at once, with no grace.
        reject_threads: False: the check is made after each call all the same and what it finds
            is ignored (the reference's loop: each call on either side follows the same work).
        graph: a :class:`kerneljudge.worker.graphs.Captured` of ``fn`` (CUDA only): each call's
            inputs are loaded into its static inputs (its static outputs filled first,
            :func:`load_static`), outside the window, and the window holds its replay alone:
            the device spins ``REPLAY_LEAD_CYCLES`` before the start event, so that the graph's
            launch is queued when the event is reached, and the end event follows the replay on
            the stream (a graph's forks join its stream before capture ends), before the
            device-wide synchronisation. The replay is called through the C-level function, so
            no Python code runs in the window.
        kept_before: the kept outputs of earlier batches (by slot), held meanwhile: their bytes
            on the device count against :data:`SNAPSHOT_DEVICE_SHARE`. A slot this batch keeps
            anew is removed from it when its new outputs are kept (its memory given back then).
        recycle: write a call's end-mark copies into copies no longer held for the audit (a
            committed call's whose slot said "not kept", or those a slot kept anew replaced)
            where they match (:func:`_end_copies`), instead of new tensors; one such set is
            held from its slot's answer through the next call. None: on the CPU, where a copy
            into fresh memory pays a page fault per page (128 MiB of float32: 57 ms against
            22 ms for a copy into memory written before, one thread of a 2-core host); on a GPU
            the caching allocator reuses blocks, and :func:`pipeline_depth` counts no buffer
            held between calls.

    Returns:
        ``(times_ms, kept, wall_s)``: one time per timed call in milliseconds; by audit slot,
        copies of the outputs (taken right after the end mark) of the calls the supervisor
        chose to keep, latest per slot (on the host past :data:`SNAPSHOT_DEVICE_SHARE`,
        :func:`_host_copies`); the
        host wall time of the timed calls' iterations (from the first timed call's input
        preparation to the end), in seconds.
    """
    if nudgeable is None:
        nudgeable = [plans(args) for args in input_sets]
    cuda = device.type == "cuda"
    start_ev = _Event(enable_timing=True) if cuda else None
    end_ev = _Event(enable_timing=True) if cuda else None
    times: list[float] = []
    kept: dict[int, list[torch.Tensor]] = {}
    stream = _current_stream() if cuda else None
    total = warmup + n
    pending: list[tuple[int, list[torch.Tensor]]] = []  # committed, slot not yet known
    seed = _randbits(62) if link is None or seed is None else seed
    cpu_end = 0
    replay = graph.graph if graph is not None and cuda else None
    static_args: list[Any] = list(graph.static_args) if replay is not None else []
    graph_outputs = graph.outputs if replay is not None else None
    static_outputs = flatten_tensors(graph_outputs)
    spare: list[Any] | None = None
    reuse: list[torch.Tensor] = []  # copies no longer held for the audit (recycle)
    recycle = not cuda if recycle is None else recycle
    room = memory = 0
    depth = PIPELINE_DEPTH
    if cuda:
        memory = torch.cuda.get_device_properties(device).total_memory
        room = int(SNAPSHOT_DEVICE_SHARE * memory)
        room -= sum(map(_device_bytes, (kept_before or {}).values()))
    wall0 = _perf_counter_ns()
    for i in range(total):
        if i == warmup:
            wall0 = _perf_counter_ns()
        k = i % len(input_sets)
        if i:
            seed = link.seed(i) if link is not None else _randbits(62)
        # Written over the previous call's inputs (perturb's ``into``); the call gets aliases
        # of them, so changing its tensors' sizes leaves the buffers as they are, a buffer
        # whose storage it shrank is not reused, and every element is written again.
        spare = perturb(input_sets[k], nudgeable[k], seed, roll, into=spare)
        # After perturb: the blocks it freed (a transposed input's contiguous build, a column
        # roll's block copies) held this call's inputs, which an unwritten output would read.
        poison(poison_bytes, device)
        args = [x.detach() if isinstance(x, torch.Tensor) else x for x in spare]
        if replay is not None:
            load_static(static_args, static_outputs, args)
        with torch.no_grad():
            if start_ev is not None and end_ev is not None and stream is not None:  # CUDA
                if flush is not None:
                    flush.fill_(i & 0xFF)
                _synchronize()
                if link is not None:
                    if i:
                        link.between_cpu_ms.append((_process_time_ns() - cpu_end) / 1e6)
                    link.mark(b"S", i)
                if replay is not None:
                    _sleep_cycles(REPLAY_LEAD_CYCLES)
                    _record(start_ev, stream)
                    _graph_replay(replay)
                    _record(end_ev, stream)
                    _synchronize()
                    out = graph_outputs
                else:
                    _record(start_ev, stream)
                    out = fn(*args)
                    _synchronize()
                    _record(end_ev, stream)
                _event_sync(end_ev)
                if link is not None:
                    link.mark(b"E", i)
                    cpu_end = _process_time_ns()
                elapsed = float(_elapsed(start_ev, end_ev))
            else:
                if link is not None:
                    if i:
                        link.between_cpu_ms.append((_process_time_ns() - cpu_end) / 1e6)
                    link.mark(b"S", i)
                t0 = _perf_counter_ns()
                out = fn(*args)
                t1 = _perf_counter_ns()
                if link is not None:
                    link.mark(b"E", i)
                    cpu_end = _process_time_ns()
                elapsed = (t1 - t0) / 1e6
            # Taken at the end mark: a result finished later (a thread, a lazy tensor) is not
            # in the copy that is committed and audited.
            copies = _end_copies(flatten_tensors(out), reuse)
            reuse = []
        if threads_before is not None:
            alive = _thread_idents() - threads_before
            if alive and reject_threads:
                named = {t.ident: t.name for t in threading.enumerate()}
                names = [
                    named.get(t) or f"thread {t}, started outside the threading module"
                    for t in sorted(alive)
                ]
                raise ThreadLeftRunning(
                    f"the candidate left {len(alive)} thread(s) running after the call (a thread "
                    f"started by the call was still running when forward returned: "
                    f"{', '.join(names[:3])})"
                )
        if check_call is not None:
            check_call(out)
        if i >= warmup:
            times.append(elapsed)
        if link is not None:
            if len(copies) > _MAX_OUTPUTS:
                raise ValueError(f"forward returned {len(copies)} tensors; at most {_MAX_OUTPUTS}")
            link.commit(i, [_output_digest(t) for t in copies])
            pending.append((i, copies))
            if cuda and not i:
                largest = max(map(_device_bytes, input_sets))
                static = _device_bytes(static_args) + _device_bytes(static_outputs)
                depth = pipeline_depth(largest, _device_bytes(copies), memory, static)
            while len(pending) > (depth if i + 1 < total else 0):
                j, held = pending.pop(0)
                slot = link.slot(j)
                if slot >= 0:
                    # The copies it replaces are let go before it is kept: on the host, their
                    # page-locked blocks then take this call's (torch's caching host allocator).
                    replaced = kept.pop(slot, [])
                    earlier = kept_before.pop(slot, []) if kept_before is not None else []
                    room += _device_bytes(replaced) + _device_bytes(earlier)
                    if recycle and (replaced or earlier):  # no longer audited: reused
                        reuse = replaced or earlier
                    del replaced, earlier
                    size = _device_bytes(held)
                    kept[slot] = held if size <= room else _host_copies(held)
                    room -= size if size <= room else 0
                elif recycle:
                    reuse = held  # the next call's copies are written into these
                # Not held past its slot (on a GPU): a call not kept, or kept on the host, frees
                # its copies before the next call, as pipeline_depth counts them. On the CPU one
                # set of copies no longer held for the audit is kept for the next call's.
                del held
        del out, args, copies
    return times, kept, (_perf_counter_ns() - wall0) / 1e9
