"""The timing stage of a verdict: baselines and candidate timed alternately in their workers,
then audited (reported times against the supervisor's clock, outputs of timed calls against the
reference, the median against the device's physical floor).

The statistics and the alternation protocol are in :mod:`kerneljudge.timing`; the timed loop
itself runs inside the workers (:mod:`kerneljudge.worker.measure`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kerneljudge.check import compare_outputs
from kerneljudge.hostload import LoadMonitor, timing_cores
from kerneljudge.reference import ReferenceSession
from kerneljudge.roofline import FLOOR_MARGIN
from kerneljudge.timing import BatchLimit, measure_judged, median_ci, summarise
from kerneljudge.verdict import DeviceInfo, Roofline, Status, TimingResult
from kerneljudge.worker import WorkerProcess, measure

if TYPE_CHECKING:
    from kerneljudge.judge import JudgeConfig

__all__ = [
    "AUDITED_CALLS",
    "below_floor",
    "roofline_of",
    "time_candidate",
    "timer_inconsistency",
]

#: Kept timed calls of the candidate checked again against the reference, at most (drawn at
#: random from those the worker kept: the last call on each input set and a random sample).
AUDITED_CALLS = 4
#: Timer consistency (see :func:`timer_inconsistency`): how far the candidate's per-call wall
#: time outside its reported windows may stray from the reference's.
OVERHEAD_MAX_FACTOR = 2.0
OVERHEAD_SLACK_MS = 0.5
OVERHEAD_MIN_FACTOR = 0.2
#: The lower bound counts only batches of at least this many calls.
LOW_BOUND_MIN_CALLS = 8


@dataclass(frozen=True)
class Batch:
    """One ``time`` request: calls, untimed warm-up calls, the wall time of the whole request
    on the supervisor's clock, the times the worker reported and the wall time it reported
    for its timed calls' iterations (trusted for the reference's worker only), milliseconds."""

    n: int
    warmup: int
    wall_ms: float
    times_ms: tuple[float, ...]
    loop_wall_ms: float = float("nan")


def _per_call_ms(batches: list[Batch], wall: str) -> float | None:
    """Wall time per call outside the reported windows, over all batches but the first (its
    calls include first-use costs).

    ``wall="supervisor"``: the request's wall time on the supervisor's clock, warm-up calls
    counted at the batch's median. ``"supervisor_low"``: the same over batches of at least
    :data:`LOW_BOUND_MIN_CALLS` calls, warm-up calls counted at the batch's fastest call (an
    estimate that errs high, so that a warm-up call faster than the timed ones cannot make an
    honest loop look empty). ``"loop"``: the loop's own wall time for its timed calls.
    """
    later = batches[1:]
    if wall == "loop":
        later = [b for b in later if np.isfinite(b.loop_wall_ms)]
        calls = sum(b.n for b in later)
        extra = sum(b.loop_wall_ms - sum(b.times_ms) for b in later)
    else:
        low = wall == "supervisor_low"
        if low:
            later = [b for b in later if b.n >= LOW_BOUND_MIN_CALLS]
        calls = sum(b.n + b.warmup for b in later)
        extra = sum(
            b.wall_ms
            - sum(b.times_ms)
            - b.warmup * float(np.min(b.times_ms) if low else np.median(b.times_ms))
            for b in later
        )
    return extra / calls if later and calls else None


def timer_inconsistency(batches: dict[str, list[Batch]], candidate: str = "candidate") -> str:
    """Why the candidate's reported times cannot be its calls' times ("" when they can be).

    Reference and candidate run the same timed loop (:mod:`kerneljudge.worker.measure`), so
    the wall time per call outside the reported windows (input preparation, poisoning, the
    L2 flush, synchronisation) is about the same for both; the reference's worker is trusted.
    The candidate's is taken from the supervisor's clock (which also holds the request's
    round trip and warm-up calls, so it can only be larger). A candidate whose time outside
    the windows is far larger than the reference's (on the supervisor's clock too) reported
    less than it ran: a rescaled or replaced clock. One whose is far smaller than the
    reference's loop alone did not run the loop: a replaced timing handler. Bounds: at most
    ``OVERHEAD_MAX_FACTOR`` x the reference's + ``OVERHEAD_SLACK_MS`` + twice its own mean
    reported time (so a rescaled clock gains at most about 3x); at least
    ``OVERHEAD_MIN_FACTOR`` x the reference's loop's, over the candidate's batches of
    :data:`LOW_BOUND_MIN_CALLS` calls or more.
    """
    ref_name = next((k for k in batches if k != candidate), None)
    if ref_name is None or candidate not in batches:
        return ""
    ref = _per_call_ms(batches[ref_name], "supervisor")
    ref_loop = _per_call_ms(batches[ref_name], "loop")
    cand = _per_call_ms(batches[candidate], "supervisor")
    cand_low = _per_call_ms(batches[candidate], "supervisor_low")
    if ref is None or cand is None:
        return ""
    mean_c = float(np.mean([t for b in batches[candidate] for t in b.times_ms]))
    if cand > OVERHEAD_MAX_FACTOR * max(ref, 0.0) + OVERHEAD_SLACK_MS + 2 * mean_c:
        return (
            f"the candidate's calls took {cand:.3g} ms each on the supervisor's clock beyond "
            f"the {mean_c:.3g} ms they reported ({ref_name}: {ref:.3g} ms)"
        )
    if (
        ref_loop is not None
        and cand_low is not None
        and ref_loop > 0
        and cand_low < OVERHEAD_MIN_FACTOR * ref_loop
    ):
        return (
            f"the candidate's timed loop took {cand_low:.3g} ms per call beyond its reported "
            f"times, less than the loop's own work ({ref_name}: {ref_loop:.3g} ms)"
        )
    return ""


def time_candidate(
    config: JudgeConfig,
    info: DeviceInfo,
    worker: WorkerProcess,
    ref: ReferenceSession,
    inputs: list[Any],
    expectations: list[tuple[Any, Any]],
    atol: float,
    rtol: float,
    trial_inputs: list[list[Any]] | None = None,
) -> tuple[TimingResult, Status, str]:
    """Time baselines and candidate alternately, then audit what was timed.

    The candidate's reported times must fit in the wall time the supervisor saw for each
    batch and agree with it as the reference's do (:func:`timer_inconsistency`; else its
    clock was tampered with); up to :data:`AUDITED_CALLS` outputs of its timed calls, on
    inputs perturbed per call, are compared with the reference run again on the same
    inputs (rebuilt here from the trial inputs and the call's seed); the upper 95% bound of its
    median must not be below the device's physical floor (:func:`below_floor`).

    Both workers are pinned to the same timing cores with the same thread count
    (:func:`kerneljudge.hostload.timing_cores`), the host's load is read while they are timed
    and a noisy pass is measured once more (:func:`kerneljudge.timing.measure_judged`), and
    each batch's time limit scales with its calls (:class:`kerneljudge.timing.BatchLimit`).

    Args:
        config: the judge's configuration (baselines, timing knobs, request limit).
        info: the judging device.
        worker: the candidate's worker, loaded, set up and run on the trials.
        ref: the reference session of the same shape set, run on the same trials.
        inputs: the last trial's inputs (for the roofline's byte count).
        expectations: ``(reference outputs, oracle outputs)`` of each trial of the shape set.
        atol, rtol: the allclose tolerances.
        trial_inputs: the inputs of each trial of the shape set, in order (the candidate's
            timed input sets are the last of them); None: ``[inputs]``.

    Returns the timing, the status it implies and the reason (empty when ``correct``).
    """
    cfg = config
    flush = 2 * (info.l2_bytes or 128 << 20) if info.kind == "cuda" else 0
    tampered: list[str] = []
    seen: dict[str, list[Batch]] = {}
    roll = ref.problem.roll_timed_inputs
    bases = trial_inputs if trial_inputs is not None else [inputs]

    def sampler(request, name: str):  # type: ignore[no-untyped-def]
        def sample(n: int, warmup: int) -> list[float]:
            if name != "candidate":
                worker.pause(True)  # nothing of the candidate runs while the reference is timed
            t0 = time.perf_counter()
            try:
                reply = request(
                    "time",
                    cfg.run_timeout_s,
                    n=n,
                    warmup=warmup,
                    flush_bytes=flush,
                    target=name,
                    roll=roll,
                )
            finally:
                if name != "candidate":
                    worker.pause(False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            times = [float(x) for x in reply["times_ms"]]
            if len(times) != n or not all(0 < x < float("inf") for x in times):
                tampered.append(f"{name} reported {len(times)} invalid times for {n} calls")
            elif sum(times) > wall_ms + 1.0:
                tampered.append(
                    f"{name} reported {sum(times):.3f} ms of calls in {wall_ms:.3f} ms of wall time"
                )
            else:
                try:
                    loop_ms = float(reply.get("wall_s", float("nan"))) * 1e3
                except (TypeError, ValueError):
                    loop_ms = float("nan")
                seen.setdefault(name, []).append(Batch(n, warmup, wall_ms, tuple(times), loop_ms))

            return times if times else [float("nan")]

        return sample

    # Compiled (or replaced, when the compile fails) before pinning: the worker pinned is the
    # one that is timed.
    compiled = "compile" in cfg.baselines and ref.ensure_compiled(
        max(cfg.run_timeout_s, 600.0), bases, cfg.run_timeout_s
    )
    # Both workers on the same timing cores with the same intra-op thread count.
    cores, threads = timing_cores(info.kind, cfg.threads)
    for request in (ref.request, worker.request):
        request("pin", cfg.run_timeout_s, cpus=list(cores), threads=threads)
    contestants = {}
    if "eager" in cfg.baselines:
        contestants["eager"] = sampler(_batch_limited(ref.request), "eager")
    contestants["candidate"] = sampler(_batch_limited(worker.request), "candidate")
    if compiled:
        contestants["compile"] = sampler(_batch_limited(ref.request), "compile")
    monitor = LoadMonitor([ref.worker.proc.pid, worker.proc.pid], cores)
    judged = measure_judged(contestants, cfg.timing_config, monitor, cores, threads)
    samples = judged.samples
    roofline = roofline_of(ref, samples["candidate"], info, inputs, expectations[-1][0])
    timing = TimingResult(
        clock="cuda_event" if info.kind == "cuda" else "monotonic",
        measurements=tuple(summarise(k, v) for k, v in samples.items()),
        speedups=judged.speedups,
        rounds=judged.rounds,
        stop_reason=judged.stop,
        l2_flush_bytes=flush,
        roofline=roofline,
        baseline_errors=(
            {"compile": f"not timed: {ref.compile_error or 'torch.compile did not run'}"}
            if "compile" in cfg.baselines and "compile" not in samples
            else {}
        ),
        host=judged.host,
        passes=judged.passes,
        threads=threads,
        cores=cores,
    )
    if not tampered:
        why = timer_inconsistency(seen)
        if why:
            tampered.append(why)
    if tampered:
        return timing, Status.REJECTED, "the timer was tampered with: " + tampered[0]
    status, why = _audit_timed_calls(cfg, worker, ref, bases, atol, rtol, roll)
    if status is not Status.CORRECT:
        return timing, status, why
    cand = timing.measurement("candidate")
    if roofline and roofline.below_floor and cand:
        return (
            timing,
            Status.REJECTED,
            f"median time {cand.median_ms:.4g} ms (95% interval up to {cand.ci95_ms[1]:.4g} "
            f"ms) is below the physical floor {roofline.floor_ms:.4g} ms of this device",
        )
    return timing, Status.CORRECT, ""


def _batch_limited(request):  # type: ignore[no-untyped-def]
    """``request`` with the limit of each ``time`` request scaled to the calls it asks for by a
    :class:`~kerneljudge.timing.BatchLimit` of its own (the limit the caller gives is the
    floor); other requests pass through."""
    limit = BatchLimit()

    def limited(op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        if op != "time":
            return request(op, timeout_s, **fields)
        calls = int(fields.get("n", 1)) + int(fields.get("warmup", 0))
        t0 = time.perf_counter()
        reply = request(op, limit.limit_s(calls, timeout_s), **fields)
        limit.observe(calls, time.perf_counter() - t0)
        return reply

    return limited


def below_floor(samples_ms: list[float], floor_ms: float) -> bool:
    """Whether the candidate cannot have done the work: the upper end of the distribution-free
    95% interval of its median (:func:`kerneljudge.timing.median_ci`) is below
    ``FLOOR_MARGIN`` x ``floor_ms``.

    Deciding from the bound, not the median, keeps the sampling spread of the median (few
    samples) from rejecting an honest candidate near the floor. Host noise (preemption,
    contention, a slower clock) only adds time to a call, so a loaded host can make a
    candidate look slower but not push it below the floor. Spreading its own times widens the
    bound little: it is the sample of rank about ``n/2 + sqrt(n)``, so to lift it above the
    floor at least about ``n/2 - sqrt(n)`` of the ``n`` samples must be above the floor.
    """
    return bool(samples_ms) and median_ci(samples_ms)[1] < FLOOR_MARGIN * floor_ms


def _audit_timed_calls(
    cfg: JudgeConfig,
    worker: WorkerProcess,
    ref: ReferenceSession,
    bases: list[list[Any]],
    atol: float,
    rtol: float,
    roll: bool = True,
) -> tuple[Status, str]:
    """Check kept outputs of the candidate's timed calls against the reference run on the
    same perturbed inputs (:func:`kerneljudge.worker.measure.perturb`)."""
    timed = worker.request("timed_outputs", cfg.run_timeout_s)
    calls: list[tuple[int, int, list[Any]]] = []
    try:
        n_sets = timed["n_sets"]
        for c in timed["calls"]:
            k, seed, outs = c["set"], c["seed"], c["outputs"]
            if type(k) is not int or type(seed) is not int or not 0 <= seed < 2**62:
                raise ValueError(f"bad call record {k!r}, {seed!r}")
            if not isinstance(outs, list) or not all(type(t) is torch.Tensor for t in outs):
                raise ValueError("outputs are not a list of tensors")
            calls.append((k, seed, list(outs)))
        if type(n_sets) is not int:
            raise ValueError(f"bad set count {n_sets!r}")
    except (KeyError, TypeError, ValueError):
        return Status.REJECTED, "the worker's record of its timed calls was tampered with"
    sets = bases[-n_sets:] if 0 < n_sets <= len(bases) else []
    if not calls or any(not (0 <= k < len(sets)) for k, _, _ in calls):
        return Status.REJECTED, "the worker reported outputs of unknown timed calls"
    count = min(AUDITED_CALLS, len(calls))
    picked = [calls.pop(secrets.randbelow(len(calls))) for _ in range(count)]
    flags = {k: [measure.continuous(x) for x in sets[k]] for k in {k for k, _, _ in picked}}
    for k, seed, outputs in picked:
        args = measure.perturb(sets[k], flags[k], seed, roll)
        expected = ref.request(
            "run", cfg.run_timeout_s, inputs=args, oracle=cfg.tolerance == "oracle", keep=False
        )
        again = compare_outputs(
            expected["outputs"],
            outputs,
            oracle=expected.get("oracle"),
            atol=atol,
            rtol=rtol,
            mode=cfg.tolerance,
        )
        if not again.passed:
            return (
                Status.INCORRECT,
                f"the output of a timed call differs from the reference: {again.reason}",
            )
    return Status.CORRECT, ""


def roofline_of(
    ref: ReferenceSession,
    samples: list[float],
    info: DeviceInfo,
    inputs: list[Any],
    outputs: Any,
) -> Roofline | None:
    """Achieved throughput, fractions of peak and the physical floor of the candidate's time
    (``below_floor`` from :func:`below_floor`: the median's upper 95% bound, not the median).

    FLOPs come from the problem's ``flop_count()``; bytes from ``byte_count()`` or, without
    one, the sizes of the inputs and outputs. Peaks come from the device table of
    :mod:`kerneljudge.roofline` (datasheets) for GPUs, and are omitted on the CPU.
    """
    from kerneljudge import roofline as rl

    flops = ref.problem.flop_count()
    nbytes = ref.problem.byte_count(inputs, outputs)
    median_s = float(np.median(samples)) / 1e3
    spec = rl.lookup(info.name) if info.kind == "cuda" else None
    if spec is None:
        return Roofline(
            flops=flops,
            bytes=nbytes,
            achieved_tflops=flops / median_s / 1e12 if flops else None,
            achieved_gbps=nbytes / median_s / 1e9 if nbytes else None,
        )
    r = rl.roofline(flops, nbytes, median_s, spec, rl.compute_dtype(ref.problem))
    floor_ms = r.floor_s * 1e3
    return Roofline(
        flops=flops,
        bytes=nbytes,
        achieved_tflops=r.achieved_tflops,
        achieved_gbps=r.achieved_gbps,
        compute_fraction=r.compute_fraction,
        bandwidth_fraction=r.bandwidth_fraction,
        floor_ms=floor_ms,
        below_floor=(not spec.measured) and below_floor(samples, floor_ms),
        source=spec.source,
    )
