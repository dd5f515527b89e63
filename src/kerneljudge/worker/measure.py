"""The timed loop run inside a worker, identical for the reference and the candidate.

Per call, outside the timed window: fresh clones of one of the input sets (rotating), one element
of each floating input nudged by one unit in the last place (so that no two calls ever see the
same content, and a cache keyed on content, shape or address cannot answer), freed memory
poisoned with NaN bit patterns (so that an output the call did not write is wrong), and the L2
cache flushed by writing a buffer twice its size. Inside the window: the call, then a
device-wide synchronisation, so work left on any stream is counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["flatten_tensors", "nudge", "poison", "time_calls"]

# Captured when the worker starts, before candidate code can patch them.
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_perf_counter_ns = time.perf_counter_ns
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def nudge(args: list[Any], gen: torch.Generator) -> None:
    """Move one random element of each floating tensor in ``args`` by one ulp, in place."""
    for x in args:
        if (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and x.numel()
            and x.is_contiguous()
        ):
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
    check_call: Callable[[Any], None] | None = None,
) -> tuple[list[float], dict[int, Any], float]:
    """Time ``n`` calls of ``fn`` (after ``warmup`` untimed ones), rotating over ``input_sets``.

    Args:
        fn: the model (or compiled model) to call under ``torch.no_grad()``.
        input_sets: one or more argument lists, already on ``device``.
        n, warmup: timed and untimed calls.
        device: where the calls run; CUDA events time them on a GPU, ``perf_counter_ns`` on CPU.
        flush: a buffer larger than the L2 cache, rewritten before each call (None on CPU).
        poison_bytes: how much freed memory to poison before each call.
        gen: the generator choosing which elements to nudge.
        check_call: called with each output right after its end mark (may raise).

    Returns:
        ``(times_ms, snapshots, wall_s)``: one time per timed call in milliseconds, a copy of
        the output of the last timed call on each input set (by set index), and the host wall
        time of the whole loop in seconds.
    """
    cuda = device.type == "cuda"
    start_ev = _Event(enable_timing=True) if cuda else None
    end_ev = _Event(enable_timing=True) if cuda else None
    times: list[float] = []
    snapshots: dict[int, Any] = {}
    wall0 = _perf_counter_ns()
    for i in range(warmup + n):
        k = i % len(input_sets)
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in input_sets[k]]
        nudge(args, gen)
        poison(poison_bytes, device)
        with torch.no_grad():
            if cuda:
                if flush is not None:
                    flush.fill_(i & 0xFF)
                _synchronize()
                start_ev.record()
                out = fn(*args)
                _synchronize()
                end_ev.record()
                end_ev.synchronize()
                elapsed = float(start_ev.elapsed_time(end_ev))
            else:
                t0 = _perf_counter_ns()
                out = fn(*args)
                elapsed = (_perf_counter_ns() - t0) / 1e6
        if check_call is not None:
            check_call(out)
        if i >= warmup:
            times.append(elapsed)
            if i >= warmup + n - len(input_sets):
                # Copied right away: a result finished later (another thread, a lazy tensor)
                # is not in the copy.
                snapshots[k] = [t.detach().clone() for t in flatten_tensors(out)]
        del out, args
    return times, snapshots, (_perf_counter_ns() - wall0) / 1e9
