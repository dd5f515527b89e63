"""The timing stage of a verdict: baselines and candidate timed alternately in their workers,
then audited (reported times against the supervisor's clock, outputs of timed calls against the
reference, the median against the device's physical floor).

The statistics and the alternation protocol are in :mod:`kerneljudge.timing`; the timed loop
itself runs inside the workers (:mod:`kerneljudge.worker.measure`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kerneljudge.check.beside import OutputsLost, outputs_beside
from kerneljudge.check.limits import REFERENCE_FLOOR_S, SetLimits
from kerneljudge.check.reference import COMPILE_TIMEOUT_S, HeldTrial, ReferenceSession
from kerneljudge.timing import (
    BatchLimit,
    Judged,
    TimingConfig,
    measure_judged,
    median_ci,
    summarise,
)
from kerneljudge.timing.graph_pass import time_replays
from kerneljudge.timing.hostload import LoadMonitor, timing_cores
from kerneljudge.timing.roofline import FLOOR_MARGIN
from kerneljudge.timing.sampling import KeptCall, Sampling
from kerneljudge.timing.timer_rule import Batch, TimerCheck, timer_check
from kerneljudge.verdict import DeviceInfo, Roofline, Status, TimingResult
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.scheduling import pin_tree
from kerneljudge.worker.stamps import KIND_SHA256, KIND_TREE

__all__ = [
    "AUDITED_CALLS",
    "AUDITED_REPLAYS",
    "AUDIT_KEEP_SHARE",
    "MIN_AUDITED_CALLS",
    "Batch",
    "TimingSettings",
    "TimerCheck",
    "audited_calls",
    "below_floor",
    "measure_checked",
    "roofline_of",
    "time_candidate",
]

#: Timed calls of the candidate kept for the audit (a uniform sample over all its timed calls,
#: drawn here after each call's outputs were committed), each checked against the reference.
AUDITED_CALLS = 8
#: The same for the candidate's graph replays (:mod:`kerneljudge.timing.graph_pass`): as many,
#: since a captured kernel can branch on a device-side counter and skip work on some replays.
AUDITED_REPLAYS = AUDITED_CALLS
#: The fewest timed calls audited (:func:`audited_calls`), however large their outputs.
MIN_AUDITED_CALLS = 2
#: The share of the device's memory (a CPU's: of the host's available memory) the kept outputs
#: of the audited calls may take in the candidate's worker (:func:`audited_calls`).
AUDIT_KEEP_SHARE = 1 / 8
#: The digest kinds a worker may commit to (:func:`kerneljudge.worker.stamps.output_digest`).
DIGEST_KINDS = frozenset({KIND_SHA256, KIND_TREE})


class TimingSettings(Protocol):
    """What the timing stage reads of the judge's configuration
    (:class:`kerneljudge.judge.JudgeConfig` has these fields; their meanings are its)."""

    @property
    def baselines(self) -> tuple[str, ...]: ...
    @property
    def timing_config(self) -> TimingConfig: ...
    @property
    def run_timeout_s(self) -> float | None: ...
    @property
    def threads(self) -> int: ...
    @property
    def tolerance(self) -> str: ...
    @property
    def graph_timing(self) -> bool: ...


def time_candidate(
    config: TimingSettings,
    info: DeviceInfo,
    worker: WorkerProcess,
    ref: ReferenceSession,
    trials: list[HeldTrial],
    atol: float,
    rtol: float,
    limits: SetLimits | None = None,
) -> tuple[TimingResult, Status, str]:
    """Time baselines and candidate alternately, then audit what was timed.

    Every timed call is observed through the workers' stamp sockets
    (:mod:`kerneljudge.worker.stamps`): its inputs' seed and whether it is kept for the audit
    are drawn here, after the worker committed to its outputs. The candidate's reported times
    must fit in the wall time of each batch and agree with the kernel-stamped windows of its
    calls as the reference's do (:func:`kerneljudge.timing.timer_rule.timer_check`; when that is
    inconclusive, everything is timed again once, and a second inconclusive answer is accepted
    with a note in ``timer_note``); the kept outputs of up to :data:`AUDITED_CALLS` timed
    calls (:func:`audited_calls`) must match their committed digests and the reference run
    again on the same inputs (rebuilt in the reference worker from the trial's inputs it holds
    and the call's seed),
    sent from the candidate's worker to the reference worker and compared there one call at a
    time; the upper 95% bound of its
    median must not be below the device's physical floor (:func:`below_floor`). On a CUDA
    device with ``graph_timing``, the contestants are then timed again by CUDA-graph replay,
    audited the same way (:func:`kerneljudge.timing.graph_pass.time_replays`), into the
    result's ``graph``.

    Both workers are pinned to the same timing cores with the same thread count
    (:func:`kerneljudge.timing.hostload.timing_cores`), the host's load is read while they are timed
    and a noisy pass is measured once more (:func:`kerneljudge.timing.measure_judged`), and
    each batch's time limit scales with its calls (:class:`kerneljudge.timing.BatchLimit`).

    Args:
        config: the judge's configuration (baselines, timing knobs, request limit).
        info: the judging device.
        worker: the candidate's worker, loaded, set up and run on the trials.
        ref: the reference session of the same shape set, run on the same trials.
        trials: the trials of the shape set, in order, held by the reference worker with
            their inputs (the candidate's timed input sets are the last of them; the first
            one's sizes give the roofline's byte count and the number of audited calls).
        atol, rtol: the allclose tolerances.
        limits: the limits of the shape set's requests (:class:`kerneljudge.check.limits.
            SetLimits`): ``run_s`` for the candidate's, ``reference_s`` for the reference's;
            each is the floor of its contestants' batch limits. None: ``run_timeout_s`` for
            both, or :data:`~kerneljudge.check.limits.REFERENCE_FLOOR_S` when it is None.

    Returns the timing, the status it implies and the reason (empty when ``correct``).
    """
    cfg = config
    run_s = limits.run_s if limits else (cfg.run_timeout_s or REFERENCE_FLOOR_S)
    ref_s = limits.reference_s if limits else run_s
    flush = 2 * (info.l2_bytes or 128 << 20) if info.kind == "cuda" else 0
    roll = ref.problem.roll_timed_inputs
    keys = [held.key for held in trials]
    # Compiled (or replaced, when the compile fails) before pinning: the worker pinned is the
    # one that is timed.
    compiled = "compile" in cfg.baselines and ref.ensure_compiled(
        max(ref_s, COMPILE_TIMEOUT_S), (), ref_s
    )
    # Both workers on the same timing cores with the same intra-op thread count.
    cores, threads = timing_cores(info.kind, cfg.threads)
    for request, limit_s in ((ref.request, ref_s), (worker.request, run_s)):
        request("pin", limit_s, cpus=list(cores), threads=threads)
    # A confined worker cannot set its own affinity (kerneljudge.worker.scheduling): set here.
    pin_tree(worker.proc.pid, cores)
    names = [n for n in ("eager",) if n in cfg.baselines] + ["candidate"]
    names += ["compile"] if compiled else []
    audited = audited_calls(trials[0].output_bytes, info)
    launched = Sampling(info, worker, cores, audited, flush, roll)
    limits_s = (run_s, ref_s)
    judged, note = measure_checked(launched, names, cfg, ref, worker, limits_s, cores, threads)
    samples = judged.samples
    first = trials[0]  # run ahead (a later one may have been deferred): the set's shapes
    roofline = roofline_of(
        ref, samples["candidate"], info, first.input_stand_ins(), first.output_stand_ins()
    )
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
        timer_note=note,
    )
    if launched.tampered:
        return timing, Status.REJECTED, "the timer was tampered with: " + launched.tampered[0]
    status, why = _audit_timed_calls(
        cfg, worker, ref, keys, atol, rtol, roll, launched.reservoir.kept, limits_s=limits_s
    )
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
    if info.kind != "cuda" or not cfg.graph_timing:
        return timing, Status.CORRECT, ""
    replays = Sampling(info, worker, cores, min(audited, AUDITED_REPLAYS), flush, roll, graph=True)
    graph, status, why = time_replays(
        replays, names, timing, cfg, ref, worker, limits_s, keys, (atol, rtol), threads
    )
    return dataclasses.replace(timing, graph=graph), status, why


def measure_checked(
    sampling: Sampling,
    names: list[str],
    cfg: TimingSettings,
    ref: ReferenceSession,
    worker: WorkerProcess,
    limits_s: tuple[float, float],
    cores: tuple[int, ...],
    threads: int,
    timing_config: TimingConfig | None = None,
) -> tuple[Judged, str]:
    """Measure ``names`` alternately through ``sampling``'s samplers
    (:func:`kerneljudge.timing.measure_judged`, the host's load read meanwhile), then audit the
    reported times against the stamps (:func:`kerneljudge.timing.timer_rule.timer_check`): an
    inconclusive answer measures everything again once (judged on the new batches, the first
    timing's batches passed as ``earlier``), a second one is accepted with a note.
    A rejection is added to ``sampling.tampered``.

    Args:
        sampling: the pass's samplers (launched calls or graph replays).
        names: the contestants, in the first round's order (``eager``, ``candidate``,
            ``compile``: the reference's baselines are timed in ``ref``'s worker).
        cfg: the judge's configuration.
        ref, worker: the reference session and the candidate's worker.
        limits_s: the floors of the candidate's and the reference's batch limits (seconds).
        cores, threads: the timing cores and the timed workers' thread count.
        timing_config: the protocol's knobs (None: ``cfg.timing_config``).

    Returns the measurement and the timer note (empty when the audit decided).
    """
    run_s, ref_s = limits_s
    contestants = {}
    for name in names:
        if name == "candidate":
            contestants[name] = sampling.sampler(
                _batch_limited(worker.request), lambda: worker, name, run_s
            )
        else:
            contestants[name] = sampling.sampler(
                _batch_limited(ref.request), lambda: ref.worker, name, ref_s
            )
    monitor = LoadMonitor([ref.worker.worker_pid(), worker.worker_pid()], cores)
    note = ""
    earlier: dict[str, list[Batch]] = {}
    for attempt in range(2):
        knobs = timing_config or cfg.timing_config
        judged = measure_judged(contestants, knobs, monitor, cores, threads)
        found = TimerCheck("ok")
        if not sampling.tampered:
            found = timer_check(sampling.seen, earlier=earlier)
        if found.status != "inconclusive":
            break
        if attempt == 0:
            # measured again: judged on the new batches (the first ones kept for the rescale
            # rule where the reference's new calls stall, and for the CPU-time rule)
            earlier = {n: list(bs) for n, bs in sampling.seen.items()}
            sampling.seen.clear()
        else:
            note = f"inconclusive, measured again and accepted: {found.reason}"
    if sampling.unstamped:
        note = "this kernel does not stamp datagrams: the calls' windows were not checked"
    if not sampling.tampered and found.status == "rejected":
        sampling.tampered.append(found.reason)
    return judged, note


def _batch_limited(request: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
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
    cfg: TimingSettings,
    worker: WorkerProcess,
    ref: ReferenceSession,
    keys: list[str],
    atol: float,
    rtol: float,
    roll: bool,
    kept: dict[int, KeptCall],
    limits_s: tuple[float, float] | None = None,
) -> tuple[Status, str]:
    """Check the kept outputs of the candidate's timed calls, one call at a time (fetched,
    checked, dropped): each must be what the worker committed to at the call's end mark (its
    digests) and match the reference run on the same perturbed inputs
    (:func:`kerneljudge.worker.measure.perturb`), which the reference worker builds from the
    trial inputs it holds under ``keys`` (the shape set's trials, in order) and compares
    there, where the digests of the outputs shown are computed too. ``limits_s``: the limits
    of the candidate's and of the reference's requests (None: ``run_timeout_s`` for both,
    :data:`~kerneljudge.check.limits.REFERENCE_FLOOR_S` when that is None)."""
    run_s, ref_s = limits_s or (cfg.run_timeout_s or REFERENCE_FLOOR_S,) * 2
    if not kept:
        return Status.REJECTED, "no timed call of the candidate was kept for the audit"
    for slot, call in sorted(kept.items()):
        shown_wrong = (
            "the outputs shown for an audited timed call are not those the worker "
            "committed to when the call ended"
        )
        kinds = [kind for kind, _ in call.digests]
        if not set(kinds) <= DIGEST_KINDS:
            return Status.REJECTED, shown_wrong
        sets = keys[-call.n_sets :] if 0 < call.n_sets <= len(keys) else []
        if not sets:
            return Status.REJECTED, "the worker reported outputs of unknown timed calls"
        oracle = cfg.tolerance == "oracle"
        ref.run_timed_call(sets[call.index % len(sets)], call.seed, roll, ref_s, oracle)

        # The outputs go from the candidate's worker to the reference worker on a pipe of their
        # own, where their digests are computed (a tree digest on its device: an int64 tree
        # over a large output is slow on the host) and they are compared.
        reply, found = outputs_beside(
            ref.worker,
            worker,
            "timed_outputs",
            run_s,
            {"slots": [slot]},
            functools.partial(
                ref.audit, None, kinds, ref_s, atol=atol, rtol=rtol, mode=cfg.tolerance
            ),
        )
        slots = reply.get("slots")
        if not isinstance(slots, dict):
            return Status.REJECTED, "the worker's record of its timed calls was tampered with"
        again, shown, received = (None, [], -1) if isinstance(found, OutputsLost) else found
        if type(slots.get(slot)) is not int or received < 0:
            return Status.REJECTED, "the worker did not keep the outputs of an audited call"
        # As many outputs as digests were committed, each matching its own (counted where
        # they arrived, not as the worker says).
        if received != len(call.digests) or shown != list(call.digests):
            return Status.REJECTED, shown_wrong
        if not again.passed:
            return (
                Status.INCORRECT,
                f"the output of a timed call differs from the reference: {again.reason}",
            )
    return Status.CORRECT, ""


def audited_calls(output_bytes: int, info: DeviceInfo) -> int:
    """How many timed calls to audit: :data:`AUDITED_CALLS`, fewer (at least
    :data:`MIN_AUDITED_CALLS`) where their kept outputs, ``output_bytes`` each, would take more
    than :data:`AUDIT_KEEP_SHARE` of the device's memory (a CPU's: of the host's available
    memory, :func:`kerneljudge.check.memory.available_bytes`): the candidate's worker holds
    them all until the audit, and a problem's outputs can be GiBs."""
    from kerneljudge.check.memory import available_bytes

    memory = info.memory_bytes if info.kind == "cuda" else (available_bytes() or 0)
    if output_bytes <= 0 or memory <= 0:
        return AUDITED_CALLS
    fits = int(AUDIT_KEEP_SHARE * memory) // output_bytes
    return max(MIN_AUDITED_CALLS, min(AUDITED_CALLS, fits))


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
    :mod:`kerneljudge.timing.roofline` (datasheets) for GPUs, and are omitted on the CPU.
    """
    from kerneljudge.timing import roofline as rl

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
