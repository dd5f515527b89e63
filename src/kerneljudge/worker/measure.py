"""The timed loop run inside a worker, identical for the reference and the candidate.

Per call, outside the timed window: new inputs made from one of the input sets (rotating) by
:func:`perturb` under a per-call seed drawn from the operating system's entropy (each continuous
floating input rolled by a random shift along its first dimension longer than one, then one
element nudged by one unit in the last place; inputs whose values are all integers, such as
masks and ids, are copied unchanged), so that calls do not see the same content (short of a
chance repeat among (rows - 1) x elements choices) and a result cached on content, shape or
address is the answer to other inputs; freed memory poisoned with NaN bit patterns (so that an
output the call did not write is wrong); and the L2 cache flushed by writing a buffer twice its
size. Inside the window: the call, then a device-wide synchronisation, so work left on any
stream is counted.

After each call, a draw from the operating system's entropy decides whether its output is kept,
with its set and seed, for the supervisor to check against the reference run on the same
perturbed inputs (and the last call on each set always is). The draw happens after the call
returns, so code under test cannot know whether a call will be checked.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["flatten_tensors", "nudge", "perturb", "poison", "time_calls"]

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
_randbelow = secrets.randbelow
_randbits = secrets.randbits
_roll = torch.roll
#: One timed call in this many has its output kept for checking (plus the last on each set).
AUDIT_ONE_IN = 8
#: Kept outputs per input set, at most (older ones are replaced at random).
AUDIT_KEEP = 3
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


#: Elements :func:`continuous` reads at a time: the first block decides for almost every real
#: input (a random float tensor), so the cost does not grow with the tensor.
CONTINUOUS_BLOCK = 1 << 16


def continuous(x: Any) -> bool:
    """Whether ``x`` is a floating tensor with some non-integer value (not a mask or ids).

    Reads ``CONTINUOUS_BLOCK`` elements at a time in storage order and stops at the first
    block with a finite non-integer value, so the answer depends on the values only and is the
    same wherever it is computed (the supervisor and both workers decide it on the same inputs).
    """
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
        return False
    if not x.is_contiguous() or x.element_size() not in _INT_VIEW:
        return False
    flat = x.reshape(-1)
    try:
        for start in range(0, flat.numel(), CONTINUOUS_BLOCK):
            block = flat[start : start + CONTINUOUS_BLOCK]
            finite = torch.isfinite(block)  # in x's own dtype: raises for most fp8 formats
            v = block.float()
            if bool((finite & (v != v.trunc())).any()):
                return True
    except (RuntimeError, TypeError):  # a dtype without these ops (most fp8 formats)
        return False
    return False


def nudge(args: list[Any], which: list[bool], gen: torch.Generator) -> None:
    """Move one random element of each tensor flagged in ``which`` by one ulp, in place.

    Flipping the lowest mantissa bit keeps a finite value of 2 bytes or more finite; an
    infinity (it would become NaN) and 1-byte (fp8) formats, where the flip can make a NaN,
    are left alone. The draw is made either way, so the generator's sequence does not depend
    on the values, and the test of the value runs on the tensor's device (no synchronisation).
    """
    for x, flagged in zip(args, which):
        if flagged:
            j = int(torch.randint(0, x.numel(), (1,), generator=gen))
            if x.element_size() < 2:
                continue
            view = x.view(_INT_VIEW[x.element_size()]).view(-1)
            # flip the lowest mantissa bit (one ulp) where the value is finite
            view[j] ^= torch.isfinite(x.view(-1)[j]).to(view.dtype)


def perturb(args: list[Any], which: list[bool], seed: int, roll: bool = True) -> list[Any]:
    """The inputs of one timed call: ``args`` with each tensor flagged in ``which`` rolled by a
    random shift (1 to size-1) along its first dimension longer than one and one random element
    nudged by one ulp; other tensors cloned, non-tensors as they are.

    Exact and deterministic given ``seed`` (the draws come from a CPU generator), on any device:
    the supervisor rebuilds a checked call's inputs on the CPU and runs the reference on them.
    A roll keeps every value and every row along later dimensions; a problem whose inputs have
    structure along the first (triangular, symmetric, sorted) sets ``ROLL_TIMED_INPUTS =
    False`` and gets ``roll=False``: the nudge only.
    """
    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for x, flagged in zip(args, which):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        if not flagged:
            out.append(x.clone())
            continue
        dims = [d for d in range(x.dim()) if x.shape[d] > 1] if roll else []
        if dims:
            shift = int(torch.randint(1, x.shape[dims[0]], (1,), generator=gen))
            # Rolled as same-width integers: the same bits, and CUDA has no fp8 roll.
            bits = x.contiguous().view(_INT_VIEW[x.element_size()])
            y = _roll(bits, shift, dims[0]).contiguous().view(x.dtype)
        else:
            y = x.clone()
        nudge([y], [True], gen)
        out.append(y)
    return out


def poison(nbytes: int, device: torch.device) -> None:
    """Fill ``nbytes`` of freshly allocated, then freed, memory with 0xFF (NaN in every float
    format), so that a later ``torch.empty`` that reuses it does not hold stale results."""
    if nbytes > 0:
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.fill_(0xFF)
        del block


def time_calls(
    fn: Callable[..., Any],
    input_sets: list[list[Any]],
    *,
    n: int,
    warmup: int,
    device: torch.device,
    flush: torch.Tensor | None,
    poison_bytes: int,
    nudgeable: list[list[bool]] | None = None,
    check_call: Callable[[Any], None] | None = None,
    roll: bool = True,
) -> tuple[list[float], dict[int, list[tuple[int, list[torch.Tensor]]]], float]:
    """Time ``n`` calls of ``fn`` (after ``warmup`` untimed ones), rotating over ``input_sets``.

    Args:
        fn: the model (or compiled model) to call under ``torch.no_grad()``.
        input_sets: one or more argument lists, already on ``device``.
        n, warmup: timed and untimed calls.
        device: where the calls run; CUDA events time them on a GPU, ``perf_counter_ns`` on CPU.
        flush: a buffer larger than the L2 cache, rewritten before each call (None on CPU).
        poison_bytes: how much freed memory to poison before each call.
        nudgeable: per set, which arguments :func:`perturb` changes (see :func:`continuous`);
            None: all continuous floating arguments, decided here.
        check_call: called with each output right after its end mark (may raise).
        roll: passed to :func:`perturb`.

    Returns:
        ``(times_ms, kept, wall_s)``: one time per timed call in milliseconds; by set index,
        ``(seed, copies of the outputs)`` of the calls kept for checking (the last timed call
        on each set and a random sample of the others), ``seed`` being the :func:`perturb` seed
        of the call's inputs; the host wall time of the timed calls' iterations (from the first
        timed call's input preparation to the end), in seconds.
    """
    if nudgeable is None:
        nudgeable = [[continuous(x) for x in args] for args in input_sets]
    cuda = device.type == "cuda"
    start_ev = _Event(enable_timing=True) if cuda else None
    end_ev = _Event(enable_timing=True) if cuda else None
    times: list[float] = []
    kept: dict[int, list[tuple[int, list[torch.Tensor]]]] = {}
    stream = _current_stream() if cuda else None
    wall0 = _perf_counter_ns()
    for i in range(warmup + n):
        if i == warmup:
            wall0 = _perf_counter_ns()
        k = i % len(input_sets)
        seed = _randbits(62)
        args = perturb(input_sets[k], nudgeable[k], seed, roll)
        poison(poison_bytes, device)
        with torch.no_grad():
            if cuda:
                if flush is not None:
                    flush.fill_(i & 0xFF)
                _synchronize()
                _record(start_ev, stream)
                out = fn(*args)
                _synchronize()
                _record(end_ev, stream)
                _event_sync(end_ev)
                elapsed = float(_elapsed(start_ev, end_ev))
            else:
                t0 = _perf_counter_ns()
                out = fn(*args)
                elapsed = (_perf_counter_ns() - t0) / 1e6
        if check_call is not None:
            check_call(out)
        if i >= warmup:
            times.append(elapsed)
            if i >= warmup + n - len(input_sets) or _randbelow(AUDIT_ONE_IN) == 0:
                # Copied right away: a result finished later (another thread, a lazy tensor)
                # is not in the copy.
                copy = (seed, [t.detach().clone() for t in flatten_tensors(out)])
                bucket = kept.setdefault(k, [])
                if len(bucket) < AUDIT_KEEP:
                    bucket.append(copy)
                else:
                    bucket[_randbelow(AUDIT_KEEP)] = copy
        del out, args
    return times, kept, (_perf_counter_ns() - wall0) / 1e9
