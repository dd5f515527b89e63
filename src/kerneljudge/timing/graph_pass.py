"""The graph pass of the timing stage: every contestant's forward captured in a CUDA graph and
timed by replay, after its launched calls were timed and audited.

A launched call's time is the device's work plus the time the device waits for the host to
launch it: a reference of many small operators follows the host core's speed, which drifts by
itself on a shared machine (docs/benchmarks/2026-11-30-h200-validation.md, run 27). A replay
launches the whole forward at once, so its time is the device's. The pass keeps every audit of
the launched pass: each replay gets fresh inputs (the same per-call seeds and perturbation),
the L2 cache is flushed before it, its outputs are committed through the stamp socket and a
uniform sample of them (:data:`~kerneljudge.timing.stage.AUDITED_REPLAYS`) is checked against
the reference run on the same inputs, and the reported times are checked against the wall time
and the stamps (:func:`~kerneljudge.timing.stage.measure_checked`).

What cannot be captured (a synchronising call, a host read of a device value, a replay that
differs from the call: :mod:`kerneljudge.worker.graphs`) is named in the result's
``not_captured``; the launched pass's speedups stand, and a candidate's fault or hang during its
capture ends the verdict as in any request.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from kerneljudge.errors import KernelJudgeError
from kerneljudge.timing import TimingConfig, summarise
from kerneljudge.timing.sampling import Sampling
from kerneljudge.verdict import GraphTiming, Speedup, Status, TimingResult
from kerneljudge.worker.replies import CaptureReply

if TYPE_CHECKING:
    from kerneljudge.check.reference import ReferenceSession
    from kerneljudge.timing.stage import TimingSettings
    from kerneljudge.worker import WorkerProcess

__all__ = [
    "CAPTURE_CALLS",
    "HOST_DRIFT",
    "NOTE_AT",
    "REPLAY_FLOOR",
    "floored",
    "host_range",
    "host_share",
    "replay_config",
    "time_replays",
]

#: Forward calls a capture request makes (two warm-up calls, the captured one, and the check's
#: call and replay): its limit is this many times the contestant's request limit.
CAPTURE_CALLS = 5
#: How far the host's side of a call may move between verdicts, either way: on the H200
#: machine the timing core ran a fixed pure-Python loop in 0.935-1.640 ms between its 10th and
#: 90th percentiles at rest (docs/benchmarks/2026-11-30-h200-validation.md, run 27), a factor
#: of 1.75, so sqrt(1.75) about the middle.
HOST_DRIFT = math.sqrt(1.75)
#: The least half-width of a replay speedup's reported 95% interval, as a share of the point:
#: on the H200 machine the replay speedups of ten verdicts from fresh processes lay within
#: 1.08% and 1.80% of their median while each verdict's own interval was ±0.1-0.5% and held that
#: median in 2 of 10 (docs/benchmarks/2026-12-02-h200-graph-replay.md): the device's state moves
#: between verdicts by more than the samples of one show.
REPLAY_FLOOR = 0.02
#: A speedup that moves by more than this share either way over its host range gets a note
#: (with ``HOST_DRIFT``, whenever a side spends more than about 6% of its launched time waiting
#: for the host).
NOTE_AT = 0.02


def replay_config(config: TimingConfig) -> TimingConfig:
    """The replays' protocol: the launched calls' with half the time budget, a minimum span of
    at most a quarter second, and no second pass on a noisy host. A replay's time is the
    device's: with the full budget, replay speedups moved by at most 1.8% between ten verdicts
    on the H200 machine where the launched ones moved by 24%
    (docs/benchmarks/2026-12-02-h200-graph-replay.md); the halved budget is not measured."""
    return dataclasses.replace(
        config,
        max_time_s=config.max_time_s / 2,
        min_time_s=min(config.min_time_s, 0.25),
        remeasure=False,
    )


def floored(sp: Speedup, floor: float = REPLAY_FLOOR) -> Speedup:
    """``sp`` with its reported interval ``ci95`` widened to at least ``median * (1 -+ floor)``
    (``ci95_samples`` and ``ci95_rounds`` kept as measured)."""
    lo, hi = sp.ci95
    return dataclasses.replace(
        sp, ci95=(min(lo, sp.median * (1 - floor)), max(hi, sp.median * (1 + floor)))
    )


def host_share(launched_ms: float, replay_ms: float) -> float:
    """``1 - replay / launched`` within [0, 1]: the share of a launched call's time in which
    the device waited for the host (0 when either time is not positive)."""
    if not (launched_ms > 0 and replay_ms > 0):
        return 0.0
    return min(1.0, max(0.0, 1.0 - replay_ms / launched_ms))


def host_range(
    baseline: tuple[float, float], candidate: tuple[float, float], drift: float = HOST_DRIFT
) -> tuple[float, float]:
    """Where the launched-call speedup ``b_l / c_l`` may move when the host's side of each
    side's calls takes up to ``drift`` times longer or shorter, each side on its own.

    Args:
        baseline, candidate: ``(launched median, replay median)`` of each side, ms.
        drift: the factor (>= 1).

    Each launched time is split into the device's (the replay's, at most the launched time)
    and the host's rest ``h``. The two sides' host parts are scaled apart, not by one factor:
    they hold different work (Python dispatch of many operators on one side, one launch and
    its completion latency on the other), and on the H200 machine the launched speedups of
    repeated verdicts moved by up to 24% where one common factor explained 3-5%
    (docs/benchmarks/2026-12-02-h200-graph-replay.md). Returns
    ``((b_r + h_b / drift) / (c_r + h_c drift), (b_r + h_b drift) / (c_r + h_c / drift))``.
    """
    (bl, br), (cl, cr) = baseline, candidate
    br, cr = min(br, bl), min(cr, cl)
    hb, hc = bl - br, cl - cr
    return ((br + hb / drift) / (cr + hc * drift), (br + hb * drift) / (cr + hc / drift))


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 300 characters."""
    return (str(exc).splitlines() or [""])[0][:300]


def _capture(
    name: str, ref: ReferenceSession, worker: WorkerProcess, limits_s: tuple[float, float]
) -> CaptureReply:
    """Capture ``name`` in its worker. A failure of the reference's worker (it runs no
    candidate code) makes that baseline not captured; the candidate's faults propagate as
    every request's do."""
    run_s, ref_s = limits_s
    if name == "candidate":
        reply = worker.request("capture", CAPTURE_CALLS * run_s, target=name)
        return CaptureReply.decode(reply, "candidate")
    try:
        reply = ref.request("capture", CAPTURE_CALLS * ref_s, target=name)
    except KernelJudgeError as exc:
        why = f"the reference's worker failed to capture it: {_first_line(exc)}"
        return CaptureReply(False, why, 0.0)
    return CaptureReply.decode(reply, "reference")


def _note(
    shares: dict[str, float], ranges: dict[str, tuple[float, float]], launched: TimingResult
) -> str:
    parts = []
    for baseline, (lo, hi) in ranges.items():
        sp = launched.speedup(baseline)
        if sp is None or not sp.median > 0:
            continue
        if lo < (1 - NOTE_AT) * sp.median or hi > (1 + NOTE_AT) * sp.median:
            parts.append(
                f"the speedup over {baseline} ({sp.median:.3g}) moves with the host's speed: "
                f"{lo:.3g}-{hi:.3g} if the host's side of each call took {HOST_DRIFT:.2f}x "
                f"less or more time ({baseline} spends {shares.get(baseline, 0.0):.0%} of its "
                f"time waiting for the host, the candidate {shares.get('candidate', 0.0):.0%})"
            )
    return "; ".join(parts)


def time_replays(
    sampling: Sampling,
    names: list[str],
    launched: TimingResult,
    cfg: TimingSettings,
    ref: ReferenceSession,
    worker: WorkerProcess,
    limits_s: tuple[float, float],
    keys: list[str],
    tolerances: tuple[float, float],
    threads: int,
) -> tuple[GraphTiming, Status, str]:
    """Capture each contestant of ``names`` and time the replays of those captured.

    Args:
        sampling: the graph pass's samplers (``Sampling(..., graph=True)``).
        names: the contestants the launched pass timed, in its order.
        launched: the launched pass's result (its medians give the host shares and ranges).
        cfg, ref, worker: as for :func:`kerneljudge.timing.stage.time_candidate`.
        limits_s: the floors of the candidate's and the reference's request limits (s).
        keys: the shape set's trials held by the reference worker, in order.
        tolerances: ``(atol, rtol)`` of the audit.
        threads: the timed workers' intra-op thread count.

    When the candidate cannot be captured, the captured baselines are timed alone (their
    replay medians still bound what the candidate's launched calls are worth, see
    :class:`kerneljudge.env.rewards.SpeedupReward`); nothing of the candidate is replayed or
    audited then. Every graph is dropped from both workers at the end.

    Returns the graph timing, and the verdict's status and reason: ``correct`` unless the
    replays' reported times broke a timer rule (``rejected``) or an audited replay's outputs
    were not those committed to (``rejected``) or differ from the reference (``incorrect``).

    Raises:
        what the candidate worker's requests raise (its faults, a timeout): as in the launched
        pass, the judge turns them into the verdict.
    """
    from kerneljudge.timing.stage import _audit_timed_calls, measure_checked

    started = time.monotonic()
    not_captured: dict[str, str] = {}
    capture_s: dict[str, float] = {}
    try:
        for name in names:
            got = _capture(name, ref, worker, limits_s)
            capture_s[name] = got.capture_s
            if not got.captured:
                not_captured[name] = got.reason or "not captured"
        timed = [n for n in names if n not in not_captured]
        if not [n for n in timed if n != "candidate"]:  # no baseline to replay
            graph = GraphTiming(
                not_captured=not_captured,
                capture_s=capture_s,
                seconds=time.monotonic() - started,
            )
            return graph, Status.CORRECT, ""
        knobs = replay_config(cfg.timing_config)
        try:
            judged, note = measure_checked(
                sampling, timed, cfg, ref, worker, limits_s, launched.cores, threads, knobs
            )
            status, why = Status.CORRECT, ""
            if sampling.tampered:
                status = Status.REJECTED
                why = "the timer was tampered with in graph replays: " + sampling.tampered[0]
            elif "candidate" in timed:
                atol, rtol = tolerances
                roll = ref.problem.roll_timed_inputs
                kept = sampling.reservoir.kept
                status, why = _audit_timed_calls(
                    cfg, worker, ref, keys, atol, rtol, roll, kept, limits_s=limits_s
                )
                if status is not Status.CORRECT:
                    why = f"in graph replay, {why}"
        except KernelJudgeError as exc:  # the reference's side failed: nothing is reported
            graph = GraphTiming(
                not_captured=not_captured,
                capture_s=capture_s,
                seconds=time.monotonic() - started,
                error=f"the replays failed in the reference's worker: {_first_line(exc)}",
            )
            return graph, Status.CORRECT, ""
    finally:
        _drop_graphs(ref, worker, limits_s)
    if status is Status.REJECTED and sampling.tampered:
        graph = GraphTiming(
            not_captured=not_captured, capture_s=capture_s, seconds=time.monotonic() - started
        )
        return graph, status, why
    medians = {n: float(np.median(v)) for n, v in judged.samples.items()}
    shares: dict[str, float] = {}
    for name, replay_ms in medians.items():
        m = launched.measurement(name)
        if m is not None:
            shares[name] = host_share(m.median_ms, replay_ms)
    ranges: dict[str, tuple[float, float]] = {}
    cand = launched.measurement("candidate")
    for sp in judged.speedups:
        m = launched.measurement(sp.baseline)
        if m is not None and cand is not None:
            ranges[sp.baseline] = host_range(
                (m.median_ms, medians[sp.baseline]), (cand.median_ms, medians["candidate"])
            )
    graph = GraphTiming(
        measurements=tuple(summarise(k, v) for k, v in judged.samples.items()),
        speedups=tuple(floored(sp) for sp in judged.speedups),
        rounds=judged.rounds,
        stop_reason=judged.stop,
        not_captured=not_captured,
        host_share=shares,
        host_range=ranges,
        host_drift=HOST_DRIFT,
        note=_note(shares, ranges, launched),
        capture_s=capture_s,
        seconds=time.monotonic() - started,
        timer_note=note,
    )
    return graph, status, why


def _drop_graphs(
    ref: ReferenceSession, worker: WorkerProcess, limits_s: tuple[float, float]
) -> None:
    """Free the graphs' memory in both workers; a worker that cannot answer is left as it is
    (the candidate's is discarded after its verdict, the reference's replaced when it fails)."""
    for request, limit_s in ((ref.request, limits_s[1]), (worker.request, limits_s[0])):
        try:
            request("drop_graphs", limit_s)
        except Exception:  # noqa: BLE001 - freeing memory never decides a verdict
            pass
