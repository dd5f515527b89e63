"""How the local executor splits this process's CPU cores among its slots."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["core_sets", "cuda_name", "default_cpu_slots"]


def default_cpu_slots(gpus: int = 0, cores: int | None = None) -> int:
    """The CPU slots the CPU timing can honour on ``cores`` cores (None: this process's
    affinity) beside ``gpus`` GPU slots: :func:`kerneljudge.timing.hostload.timing_cores`
    reserves ``max(1, (n - 1) // 2)`` of ``n`` cores for timed CPU work and leaves the rest to
    the harness, so each CPU slot stands for one timed core and one harness core; a GPU slot
    takes two cores. At least one CPU slot when there is no GPU slot."""
    n = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(0 if gpus else 1, (n - 2 * gpus - 1) // 2)


def core_sets(slots: int, cores: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """``slots`` disjoint sets of ``len(cores) // slots`` consecutive cores each (``cores``
    None: this process's affinity, sorted); leftover cores belong to no slot.

    Raises:
        ValueError: fewer cores than slots.
    """
    allowed = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if slots <= 0:
        return []
    per = len(allowed) // slots
    if per == 0:
        raise ValueError(
            f"{slots} slots need at least {slots} CPU cores; this process may use {len(allowed)}"
        )
    return [tuple(allowed[i * per : (i + 1) * per]) for i in range(slots)]


def cuda_name(device: str) -> str:
    """``cuda:N`` for ``cuda:N``.

    Raises:
        ValueError: any other string.
    """
    head, _, index = device.partition(":")
    if head != "cuda" or not index.isdigit():
        raise ValueError(f"unknown device {device!r} (expected cuda:N)")
    return f"cuda:{int(index)}"
