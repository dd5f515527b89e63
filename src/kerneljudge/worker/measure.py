"""The timed loop run inside a worker, identical for the reference and the candidate.

Per call, outside the timed window: fresh clones of one of the input sets (rotating), one element
of each continuous floating input nudged by one unit in the last place (so that no two calls
ever see the same content, and a cache keyed on content, shape or address cannot answer; inputs
whose values are all integers, such as masks, are left alone since a nudge could change their
meaning), freed memory poisoned with NaN bit patterns (so that an output the call did not write
is wrong), and the L2 cache flushed by writing a buffer twice its size. Inside the window: the
call, then a device-wide synchronisation, so work left on any stream is counted.

After each call, a draw from the operating system's entropy decides whether its output is kept
for the supervisor to check (and the last call on each set always is). The draw happens after
the call returns, so code under test cannot know whether a call will be checked.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["flatten_tensors", "nudge", "poison", "time_calls"]

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


def continuous(x: Any) -> bool:
    """Whether ``x`` is a floating tensor with some non-integer value (not a mask or ids)."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
        return False
    if not x.is_contiguous() or x.element_size() not in _INT_VIEW:
        return False
    try:
        finite = x[torch.isfinite(x)].float()
        return bool((finite != finite.trunc()).any())
    except (RuntimeError, TypeError):  # a dtype without these ops (some fp8 builds)
        return False


def nudge(args: list[Any], which: list[bool], gen: torch.Generator) -> None:
    """Move one random element of each tensor flagged in ``which`` by one ulp, in place."""
    for x, flagged in zip(args, which):
        if flagged:
            view = x.view(_INT_VIEW[x.element_size()]).view(-1)
            j = int(torch.randint(0, x.numel(), (1,), generator=gen))
            view[j] ^= 1  # flip the lowest mantissa bit: one ulp


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
    gen: torch.Generator,
    nudgeable: list[list[bool]] | None = None,
    check_call: Callable[[Any], None] | None = None,
) -> tuple[list[float], dict[int, list[Any]], float]:
    """Time ``n`` calls of ``fn`` (after ``warmup`` untimed ones), rotating over ``input_sets``.

    Args:
        fn: the model (or compiled model) to call under ``torch.no_grad()``.
        input_sets: one or more argument lists, already on ``device``.
        n, warmup: timed and untimed calls.
        device: where the calls run; CUDA events time them on a GPU, ``perf_counter_ns`` on CPU.
        flush: a buffer larger than the L2 cache, rewritten before each call (None on CPU).
        poison_bytes: how much freed memory to poison before each call.
        gen: the generator choosing which elements to nudge.
        nudgeable: per set, which arguments may be nudged (see :func:`continuous`); None: all
            continuous floating arguments, decided here.
        check_call: called with each output right after its end mark (may raise).

    Returns:
        ``(times_ms, kept, wall_s)``: one time per timed call in milliseconds; copies of the
        outputs kept for checking, by set index (the last timed call on each set and a random
        sample of the others); the host wall time of the whole loop in seconds.
    """
    if nudgeable is None:
        nudgeable = [[continuous(x) for x in args] for args in input_sets]
    cuda = device.type == "cuda"
    start_ev = _Event(enable_timing=True) if cuda else None
    end_ev = _Event(enable_timing=True) if cuda else None
    times: list[float] = []
    kept: dict[int, list[Any]] = {}
    stream = _current_stream() if cuda else None
    wall0 = _perf_counter_ns()
    for i in range(warmup + n):
        k = i % len(input_sets)
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in input_sets[k]]
        nudge(args, nudgeable[k], gen)
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
                copy = [t.detach().clone() for t in flatten_tensors(out)]
                bucket = kept.setdefault(k, [])
                if len(bucket) < AUDIT_KEEP:
                    bucket.append(copy)
                else:
                    bucket[_randbelow(AUDIT_KEEP)] = copy
        del out, args
    return times, kept, (_perf_counter_ns() - wall0) / 1e9
