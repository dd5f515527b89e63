"""The timing stage of a verdict: baselines and candidate timed alternately in their workers,
then audited (reported times against the supervisor's clock, outputs of timed calls against the
reference, the median against the device's physical floor).

The statistics and the alternation protocol are in :mod:`kerneljudge.timing`; the timed loop
itself runs inside the workers (:mod:`kerneljudge.worker.measure`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from kerneljudge.check import compare_outputs
from kerneljudge.reference import ReferenceSession
from kerneljudge.timing import measure_alternating, speedups, summarise
from kerneljudge.verdict import DeviceInfo, Roofline, Status, TimingResult
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.process import timing_cpu

if TYPE_CHECKING:
    from kerneljudge.judge import JudgeConfig

__all__ = ["roofline_of", "time_candidate"]


def time_candidate(
    config: JudgeConfig,
    info: DeviceInfo,
    worker: WorkerProcess,
    ref: ReferenceSession,
    inputs: list[Any],
    expectations: list[tuple[Any, Any]],
    atol: float,
    rtol: float,
) -> tuple[TimingResult, Status, str]:
    """Time baselines and candidate alternately, then audit what was timed.

    The candidate's reported times must fit in the wall time the supervisor saw for each
    batch (else its clock was tampered with); the outputs of its last timed call on each
    input set are compared with the reference's (the oracle rule, since the timed inputs
    were nudged by one ulp); its median must not be below the device's physical floor.

    Args:
        config: the judge's configuration (baselines, timing knobs, request limit).
        info: the judging device.
        worker: the candidate's worker, loaded, set up and run on the trials.
        ref: the reference session of the same shape set, run on the same trials.
        inputs: the last trial's inputs (for the roofline's byte count).
        expectations: ``(reference outputs, oracle outputs)`` of each trial of the shape set.
        atol, rtol: the allclose tolerances.

    Returns the timing, the status it implies and the reason (empty when ``correct``).
    """
    cfg = config
    flush = 2 * (info.l2_bytes or 128 << 20) if info.kind == "cuda" else 0
    tampered: list[str] = []

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

            return times if times else [float("nan")]

        return sample

    if info.kind == "cuda":
        for request in (ref.request, worker.request):
            request("pin", cfg.run_timeout_s, cpu=timing_cpu())
    contestants = {}
    if "eager" in cfg.baselines:
        contestants["eager"] = sampler(ref.request, "eager")
    contestants["candidate"] = sampler(worker.request, "candidate")
    if "compile" in cfg.baselines and ref.ensure_compiled(max(cfg.run_timeout_s, 600.0)):
        contestants["compile"] = sampler(ref.request, "compile")
    samples, rounds, stop = measure_alternating(contestants, cfg.timing_config)
    roofline = roofline_of(ref, samples["candidate"], info, inputs, expectations[-1][0])
    timing = TimingResult(
        clock="cuda_event" if info.kind == "cuda" else "monotonic",
        measurements=tuple(summarise(k, v) for k, v in samples.items()),
        speedups=tuple(speedups(samples)),
        rounds=rounds,
        stop_reason=stop,
        l2_flush_bytes=flush,
        roofline=roofline,
    )
    if tampered:
        return timing, Status.REJECTED, "the timer was tampered with: " + tampered[0]
    timed = worker.request("timed_outputs", cfg.run_timeout_s)
    kept = expectations[-int(timed["n_sets"]) :] if int(timed["n_sets"]) else []
    for k, calls in dict(timed["outputs"]).items():
        if not 0 <= int(k) < len(kept):
            return timing, Status.REJECTED, "the worker reported outputs of unknown calls"
        expected, oracle = kept[int(k)]
        for outputs in calls:
            again = compare_outputs(expected, list(outputs), oracle=oracle, atol=atol, rtol=rtol)
            if not again.passed:
                return (
                    timing,
                    Status.INCORRECT,
                    f"the output of a timed call differs from the reference: {again.reason}",
                )
    cand = timing.measurement("candidate")
    if roofline and roofline.below_floor and cand:
        return (
            timing,
            Status.REJECTED,
            f"median time {cand.median_ms:.4g} ms is below the physical floor "
            f"{roofline.floor_ms:.4g} ms of this device",
        )
    return timing, Status.CORRECT, ""


def roofline_of(
    ref: ReferenceSession,
    samples: list[float],
    info: DeviceInfo,
    inputs: list[Any],
    outputs: Any,
) -> Roofline | None:
    """Achieved throughput, fractions of peak and the physical floor of the candidate's time.

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
    return Roofline(
        flops=flops,
        bytes=nbytes,
        achieved_tflops=r.achieved_tflops,
        achieved_gbps=r.achieved_gbps,
        compute_fraction=r.compute_fraction,
        bandwidth_fraction=r.bandwidth_fraction,
        floor_ms=r.floor_s * 1e3,
        below_floor=r.below_floor,
        source=spec.source,
    )
