"""Whether a candidate's reported call times are its calls' times, judged from the kernel's
stamps of each call's boundaries (:mod:`kerneljudge.worker.stamps`).

Per timed call ``i`` the supervisor has the window ``W_i = E_i - S_i`` between the kernel stamps
of the datagrams sent right before the start mark and right after the end mark, and the time
``r_i`` the worker reported; per pair of consecutive timed calls, the worker's own time between
them, ``h_i = (C_i - E_i) + (S_{i+1} - max(C_i, N_i, K_i))`` (end mark to commit, then from the
latest of the commit, the sending of the next call's seed and that of this call's audit slot to
the next start mark; work on the next call needs its seed, and a loop that holds no committed
outputs waits for the slot; warm-up calls included: copying, digesting and checking the outputs,
poisoning, perturbing the next inputs). The reference runs the same loop in a trusted worker,
at the same moment (alternating batches), on the same inputs.

* **Rescaled clock.** Both clocks see the whole call, so ``e_i = W_i - r_i`` is the loop's own
  fixed cost between a stamp and a clock read (a system call and a clock read on the CPU; event
  launch and completion latency on a GPU), whatever the load: preemption inside the window
  lengthens ``W_i`` and ``r_i`` alike. A clock slowed by a factor ``s`` adds
  ``W_i (1 - 1/s)``. Per candidate call, the share ``(e_i - U - RESCALE_SLACK_MS) / W_i``, with
  ``U`` the upper confidence bound of the reference's median ``e``; rejected when the lower
  bound of its median exceeds ``RESCALE_FRACTION``. A 1.2x clock makes the share about
  ``1/6 - (U + slack) / W`` on every call, however long load makes it, so it is caught for calls
  with ``W (1/6 - 0.08) > U + RESCALE_SLACK_MS``: from about 0.3 ms on an idle CPU (``U`` is a
  few microseconds there), about 0.7 ms on a 2-core machine at load 20 (``U`` near 0.04 ms).
* **Work moved out of the windows** (a replaced timing handler, or a loop that computes a call's
  outputs after its end mark or before its start mark). Two yardsticks.

  - *CPU time* (CPU workers): per batch, a lower bound on the CPU time the candidate's
    worker and every process it started used between its windows, per gap
    (:func:`_gap_cpu_floor`: the tree's CPU time over the request, by the kernel's count,
    minus what its pinned cores could have run inside the windows, each capped at
    ``WINDOW_CAP`` median windows, and before and after them, capped by the reference's
    same times), against the reference worker's own count of its CPU time between calls
    (:attr:`Batch.between_cpu_ms`, trusted; its mean). Rejected when the lower median over
    the candidate's batches, each weighted by its gaps, exceeds (``1 + GAP_REF_FACTOR``) times
    the reference's mean, plus ``GAP_FRACTION`` of the candidate's median window, plus
    ``GAP_SLACK_MS``, and at least two batches do; ``inconclusive`` when fewer do (a
    collection pause or one-time work in one gap of one batch). The weights keep a few-call
    batch from deciding: its time before the first and after the last window, long on a
    loaded host, is spread over few gaps and sinks its floor (a timing's first batches of 3
    calls, beside batches of 200). A second timing (``earlier`` holds the first's batches)
    is judged on the candidate's batches of both, each against its own timing's reference:
    a timing of one long batch beside its few-call ones is decided by the next.
    CPU workers sleep while they wait for the supervisor, so an honest loop's count
    holds its own work only, whatever the load; work moved out of a window shortens that
    window, so the time the host kept the worker off the CPU inside the windows, which
    lowers the bound, is small exactly where work moved; and idle time bought with a sleep
    inside a window or before the first call buys at most the caps.
  - *Wall time*: ``h``. Past the bound when the lower bound of the candidate's median ``h``
    exceeds the upper bound of the reference's by ``GAP_REF_FACTOR`` times the reference's
    median ``h``, plus the same fraction and slack. Rejected where there is no CPU count (GPU
    workers, which poll for the supervisor and wait for the device on the CPU); with one, long
    gaps that the CPU count does not confirm are ``inconclusive``: a loaded host preempts a
    worker, and wakes it late, inside its gaps too (on 2 busy cores, in more than half of a
    candidate's gaps while the reference's were short).

Medians, with distribution-free confidence bounds from order statistics (:func:`median_bounds`),
ignore stalls of fewer than half the calls. When the point estimate is past a bound but the
interval is not, the answer is ``inconclusive``: the caller measures again and, if it stays
undecided, accepts with a note. Noise widens the intervals; it does not move them apart.

The bounds need calls: with ``m`` reference calls, ``U`` is about the ``m/2 + 1.5 sqrt(m)``-th
smallest ``e``, so with 16 calls three stalled ones (a loaded host preempting the reference
between a stamp and a clock read, for milliseconds) lift ``U`` to a stall's length, and a clock
slowed 100x passes in calls shorter than that. A candidate that reports very short calls leaves
the reference few. So when ``U`` is above :data:`LEVEL_FACTOR` times the reference's median
``e`` plus the slack, the rescale rule is also applied against that level, and past it the
answer is ``inconclusive`` (never ``rejected``): the caller measures again and passes the first
timing's reference batches as ``earlier``. Where the new reference calls stall the same way, the
rule is taken on the reference's calls of both timings (the same loop, twice the calls: it takes
eight stalls among 32 to lift ``U`` again); only where that clears the stall does it decide,
and only this rule; the CPU-time rule reads the candidate's batches of both timings, each
against its own timing's reference; every other rule reads the timing being judged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Batch", "TimerCheck", "median_bounds", "timer_check"]

RESCALE_FRACTION = 0.08
RESCALE_SLACK_MS = 0.02
GAP_REF_FACTOR = 1.0
GAP_FRACTION = 0.1
GAP_SLACK_MS = 0.05
#: Most a window counts, in median windows of its batch, in the CPU-time floor.
WINDOW_CAP = 3.0
#: Most the time before the first and after the last window counts, in the reference's
#: median of the same, plus a slack (ms).
EDGE_CAP = 3.0
EDGE_SLACK_MS = 1.0
#: Normal quantile of the two-sided bounds (about 99.7 %).
Z = 3.0
#: Calls (or gaps) each side needs before a rule decides anything. With few, the bounds are
#: the sample's extremes: every candidate value must be past every reference value.
MIN_CALLS = 3
#: The rescale rule's second level: this many times the reference's median ``e``, plus the
#: slack; only ever makes the answer ``inconclusive``.
LEVEL_FACTOR = 2.0


@dataclass(frozen=True)
class Batch:
    """One ``time`` request as the supervisor saw it, milliseconds: calls, untimed warm-up
    calls, the request's wall time, the reported time of each timed call, its kernel-stamped
    window, and the worker's own time between consecutive calls (warm-up ones included)."""

    n: int
    warmup: int
    wall_ms: float
    times_ms: tuple[float, ...]
    windows_ms: tuple[float, ...] = ()
    gaps_ms: tuple[float, ...] = ()
    #: The CPU time the worker's process tree used over the whole request, by the kernel's
    #: count (:func:`kerneljudge.worker.stamps.tree_cpu_ns`); None: not read.
    tree_cpu_ms: float | None = None
    #: CPU cores the worker's threads were pinned to.
    cores: int = 1
    #: A trusted worker's own CPU time between consecutive calls' windows (the reference's;
    #: empty for a candidate, whose word is not taken).
    between_cpu_ms: tuple[float, ...] = ()
    #: The warm-up calls' kernel-stamped windows.
    lead_windows_ms: tuple[float, ...] = ()
    #: Wall time from the request to the first start mark, and from the last end mark to the
    #: reply (:func:`kerneljudge.timing.sampling.request_edges`).
    edges_ms: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class TimerCheck:
    """``status``: ``"ok"``, ``"rejected"`` or ``"inconclusive"``; ``reason`` says why."""

    status: str
    reason: str = ""


def median_bounds(values: list[float] | np.ndarray, z: float = Z) -> tuple[float, float, float]:
    """``(low, median, high)``: the sample median and distribution-free bounds on the true
    median (order statistics ``m/2 -+ z sqrt(m)/2``, clipped to the sample's extremes)."""
    x = np.sort(np.asarray(values, dtype=float))
    m = len(x)
    half = z * math.sqrt(m) / 2
    lo = int(max(0, math.floor(m / 2 - half)))
    hi = int(min(m - 1, math.ceil(m / 2 + half) - 1))
    return float(x[lo]), float(np.median(x)), float(x[hi])


def _pool(batches: list[Batch], what: str) -> np.ndarray:
    rows: list[float] = []
    for b in batches:
        if what == "excess":
            rows += [w - r for w, r in zip(b.windows_ms, b.times_ms)]
        elif what == "window":
            rows += list(b.windows_ms)
        else:
            rows += list(b.gaps_ms)
    return np.asarray([v for v in rows if math.isfinite(v)], dtype=float)


def _gap_cpu_floor(b: Batch, ref_batches: dict[str, list[Batch]]) -> float:
    """A lower bound (ms per gap) on the CPU time the candidate's process tree used between
    its calls' windows in batch ``b``: its CPU time over the request minus what its pinned
    cores could have run inside the windows and before the first and after the last. Each
    window counts at most ``WINDOW_CAP`` times the batch's median window (an honest call's CPU
    time does not grow with the time the host kept it waiting; an idle window bought with a
    sleep would otherwise buy that much slack), and the time before and after at most
    ``EDGE_CAP`` times the reference's (its loop does the same there) plus ``EDGE_SLACK_MS``."""
    timed = list(b.windows_ms) or [0.0]
    cap = WINDOW_CAP * float(np.median(timed))
    inside = sum(min(w, cap) for w in [*b.lead_windows_ms, *b.windows_ms])
    ref_edges = [r.edges_ms for bs in ref_batches.values() for r in bs]
    before_cap = EDGE_CAP * float(np.median([e[0] for e in ref_edges])) + EDGE_SLACK_MS
    after_cap = EDGE_CAP * float(np.median([e[1] for e in ref_edges])) + EDGE_SLACK_MS
    rest = inside + min(b.edges_ms[0], before_cap) + min(b.edges_ms[1], after_cap)
    return (float(b.tree_cpu_ms or 0.0) - b.cores * rest) / _gaps(b)


def _gaps(b: Batch) -> int:
    """The gaps between consecutive calls of batch ``b`` (warm-up calls included), at least 1."""
    return max(1, b.n + b.warmup - 1)


def _lower_weighted_median(floors: list[tuple[float, int]]) -> float:
    """The lower weighted median of ``(value, weight)`` pairs sorted by value: the smallest value
    at which the cumulative weight reaches half the total (equal weights: the lower median)."""
    total = sum(w for _, w in floors)
    seen = 0
    for value, weight in floors:
        seen += weight
        if 2 * seen >= total:
            return value
    return floors[-1][0]


def timer_check(
    batches: dict[str, list[Batch]],
    candidate: str = "candidate",
    earlier: dict[str, list[Batch]] | None = None,
) -> TimerCheck:
    """Judge the candidate's reported times against its stamped windows, next to the other
    contestants' (the reference's worker, pooled); see the module's description. ``earlier``:
    the batches of a timing before this one: the reference's are read by the rescale rule
    where this timing's reference calls stalled, and with the candidate's by the CPU-time
    rule."""
    earlier = earlier or {}
    refs = [b for name, bs in batches.items() if name != candidate for b in bs]
    cand = batches.get(candidate, [])
    if not refs or not cand:
        return TimerCheck("ok")
    ref_batches = {name: bs for name, bs in batches.items() if name != candidate}
    e_ref = np.concatenate([_pool(bs, "excess") for bs in ref_batches.values()])
    h_ref = np.concatenate([_pool(bs, "gap") for bs in ref_batches.values()])
    e_c, w_c, h_c = _pool(cand, "excess"), _pool(cand, "window"), _pool(cand, "gap")
    undecided: list[str] = []
    if len(e_c) >= MIN_CALLS and len(e_ref) >= MIN_CALLS:
        _, med_r, hi_r = median_bounds(e_ref)
        e_old = [_pool(bs, "excess") for name, bs in earlier.items() if name != candidate]
        if e_old and hi_r > LEVEL_FACTOR * med_r + RESCALE_SLACK_MS:
            _, med_both, hi_both = median_bounds(np.concatenate([e_ref, *e_old]))
            if hi_both <= LEVEL_FACTOR * med_both + RESCALE_SLACK_MS:  # pooling clears it
                med_r, hi_r = med_both, hi_both
        level = LEVEL_FACTOR * med_r + RESCALE_SLACK_MS
        # per call: the share of the window not covered by the reported time beyond the loop's
        # own cost (the reference's, at its upper bound, plus the slack); a slowed clock makes
        # it 1 - 1/s on every call, whatever the call's length under load
        share = (e_c - hi_r - RESCALE_SLACK_MS) / np.maximum(w_c, 1e-9)
        lo_c, med_c, _ = median_bounds(share)
        why = (
            f"its calls' windows on the kernel's clock exceed the times it reported by "
            f"{float(np.median(e_c)):.4g} ms (median; the reference's: {med_r:.4g} ms) in "
            f"calls of {float(np.median(w_c)):.4g} ms: a clock running slow"
        )
        if lo_c > RESCALE_FRACTION:
            return TimerCheck("rejected", why)
        if med_c > RESCALE_FRACTION:
            undecided.append(why)
        elif hi_r > level:
            # A few stalled reference calls (preempted between a stamp and a clock read) lift
            # ``U`` when the reference has few calls; against twice its median (plus the slack)
            # in its place, the same rule is only enough to measure again.
            lo_q = median_bounds((e_c - level - RESCALE_SLACK_MS) / np.maximum(w_c, 1e-9))[0]
            if lo_q > RESCALE_FRACTION:
                undecided.append(f"{why} (the reference's few calls stalled)")
    window = float(np.median(w_c)) if len(w_c) else 0.0
    # The CPU-time rule reads this timing's batches and, when it is a second one, the first's
    # (each candidate batch's floor against its own timing's reference).
    old_refs = {name: bs for name, bs in earlier.items() if name != candidate}
    timings = [(cand, ref_batches)]
    if earlier.get(candidate) and old_refs:
        timings.append((earlier[candidate], old_refs))
    cpu_ref = [
        x for _, refs in timings for bs in refs.values() for b in bs for x in b.between_cpu_ms
    ]
    counted = all(b.tree_cpu_ms is not None for bs, _ in timings for b in bs)
    counted = counted and len(cpu_ref) >= MIN_CALLS
    per_gap = 0.0
    if counted:
        # The kernel's count of the CPU time the candidate's processes used between its
        # windows, against what the reference's loop used there by its own (trusted) count.
        yard = float(np.mean(cpu_ref))
        limit = (1.0 + GAP_REF_FACTOR) * yard + GAP_FRACTION * window + GAP_SLACK_MS
        floors = sorted((_gap_cpu_floor(b, refs), _gaps(b)) for bs, refs in timings for b in bs)
        per_gap = _lower_weighted_median(floors)
        past = sum(f > limit for f, _ in floors)
        why = (
            f"its processes used at least {per_gap:.4g} ms of CPU time between timed calls "
            f"(per call, the kernel's count; the reference's same loop: {yard:.4g} ms): "
            "work done outside the timed windows"
        )
        if past >= 2 and per_gap > limit:
            return TimerCheck("rejected", why)
        if past:
            undecided.append(why)
    if len(h_c) >= MIN_CALLS and len(h_ref) >= MIN_CALLS:
        lo_c, med_c, _ = median_bounds(h_c)
        _, med_r, hi_r = median_bounds(h_ref)
        bound = GAP_REF_FACTOR * med_r + GAP_FRACTION * window + GAP_SLACK_MS
        why = (
            f"its loop spent {med_c:.4g} ms between timed calls (median; the reference's "
            f"same loop: {med_r:.4g} ms): work done outside the timed windows"
        )
        if lo_c - hi_r > bound and not counted:
            return TimerCheck("rejected", why)
        if lo_c - hi_r > bound:
            # Long on the wall clock with no matching CPU time: a loaded host preempts and
            # wakes a worker late inside its gaps too.
            undecided.append(
                f"its loop spent {med_c:.4g} ms between timed calls (median; the reference's "
                f"same loop: {med_r:.4g} ms), but the kernel's count of its CPU time shows "
                f"only {max(0.0, per_gap):.4g} ms of work there: the host may have kept it "
                "off the CPU"
            )
        elif med_c - med_r > bound and not counted:
            undecided.append(why)
    if undecided:
        return TimerCheck("inconclusive", undecided[0])
    return TimerCheck("ok")
