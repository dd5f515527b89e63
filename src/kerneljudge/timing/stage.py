"""The timing stage of a verdict: baselines and candidate timed alternately in their workers,
then audited (reported times against the supervisor's clock, outputs of timed calls against the
reference, the median against the device's physical floor).

The statistics and the alternation protocol are in :mod:`kerneljudge.timing`; the timed loop
itself runs inside the workers (:mod:`kerneljudge.worker.measure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from kerneljudge.check.limits import REFERENCE_FLOOR_S, SetLimits
from kerneljudge.check.reference import COMPILE_TIMEOUT_S, HeldTrial, ReferenceSession
from kerneljudge.timing import BatchLimit, TimingConfig, measure_judged, median_ci, summarise
from kerneljudge.timing.hostload import LoadMonitor, timing_cores
from kerneljudge.timing.roofline import FLOOR_MARGIN
from kerneljudge.timing.timer_rule import Batch, TimerCheck, timer_check
from kerneljudge.verdict import DeviceInfo, Roofline, Status, TimingResult
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.replies import TimeReply
from kerneljudge.worker.stamps import (
    KIND_SHA256,
    KIND_TREE,
    BatchObservation,
    Observer,
    Reservoir,
)

__all__ = [
    "AUDITED_CALLS",
    "Batch",
    "TimingSettings",
    "TimerCheck",
    "below_floor",
    "roofline_of",
    "time_candidate",
]

#: Timed calls of the candidate kept for the audit (a uniform sample over all its timed calls,
#: drawn here after each call's outputs were committed), each checked against the reference.
AUDITED_CALLS = 8
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


@dataclass(frozen=True)
class KeptCall:
    """A candidate call kept for the audit: its call index in its batch, the batch's input
    set count, its inputs' seed and its committed ``(kind, digest)`` per output."""

    index: int
    n_sets: int
    seed: int
    digests: tuple[tuple[int, bytes], ...]


def _observed(obs: BatchObservation) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Windows of the timed calls and the worker's time between consecutive calls, warm-up
    ones included (the same loop), in ms."""
    total = obs.warmup + obs.n
    calls = obs.calls
    timed = range(obs.warmup, total)
    windows = tuple((calls[i].end_ns - calls[i].start_ns) / 1e6 for i in timed)  # type: ignore[operator]
    gaps = tuple(
        (
            (calls[i].commit_ns - calls[i].end_ns)  # type: ignore[operator]
            + calls[i + 1].start_ns
            - max(calls[i].commit_ns, calls[i].next_seed_ns)  # type: ignore[type-var]
        )
        / 1e6
        for i in range(total - 1)
        if calls[i].next_seed_ns is not None
    )
    return windows, gaps


def request_edges(obs: BatchObservation) -> tuple[tuple[float, ...], tuple[float, float]]:
    """The warm-up calls' windows, and the wall time (ms) from the request to the first call's
    start mark and from the last call's end mark to the reply; ``((), (0, 0))`` where a
    stamp is missing."""
    calls = [obs.calls.get(i) for i in range(obs.warmup + obs.n)]
    if (
        not calls
        or obs.request_ns is None
        or obs.reply_ns is None
        or any(c is None or c.start_ns is None or c.end_ns is None for c in calls)
    ):
        return (), (0.0, 0.0)
    lead = tuple((c.end_ns - c.start_ns) / 1e6 for c in calls[: obs.warmup])  # type: ignore[operator,union-attr]
    before = (calls[0].start_ns - obs.request_ns) / 1e6  # type: ignore[operator,union-attr]
    after = (obs.reply_ns - calls[-1].end_ns) / 1e6  # type: ignore[operator,union-attr]
    return lead, (max(0.0, before), max(0.0, after))


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
    calls must match their committed digests and the reference run again on the same inputs
    (rebuilt in the reference worker from the trial's inputs it holds and the call's seed),
    fetched and compared one call at a time; the upper 95% bound of its
    median must not be below the device's physical floor (:func:`below_floor`).

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
            their inputs (the candidate's timed input sets are the last of them; the last
            one's sizes give the roofline's byte count).
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
    tampered: list[str] = []
    seen: dict[str, list[Batch]] = {}
    roll = ref.problem.roll_timed_inputs
    keys = [held.key for held in trials]
    reservoir = Reservoir(AUDITED_CALLS)
    unstamped: list[str] = []
    pace: dict[str, float] = {}  # wall ms per call of each contestant's last request

    def sampler(request, process, name: str, floor_s: float):  # type: ignore[no-untyped-def]
        cand = name == "candidate"

        def sample(n: int, warmup: int) -> list[float]:
            # A request holds at most a quarter of the request limit at the wall time per call
            # seen so far (the loop's own work per call, outside the timed window, can be far
            # above a fast call's time); more calls go in further requests.
            per_call = pace.get(name)
            most = max(1, int(floor_s * 250.0 / per_call)) if per_call else n
            times: list[float] = []
            done = 0
            while done < n:
                chunk = min(most, n - done)
                got = _one_request(chunk, warmup if done == 0 else 0)
                if len(got) != chunk:
                    return got if got else [float("nan")]
                times += got
                done += chunk
            return times

        def _one_request(n: int, warmup: int) -> list[float]:
            if not cand:
                worker.pause(True)  # nothing of the candidate runs while the reference is timed
            t0 = time.perf_counter()
            try:
                reply, obs = Observer(process().stamps, cores).run(
                    request,
                    floor_s,
                    n=n,
                    warmup=warmup,
                    keep=(lambda i: reservoir.offer()) if cand else (lambda i: -1),
                    cpu_root=process().proc.pid if cand and info.kind != "cuda" else None,
                    flush_bytes=flush,
                    target=name,
                    roll=roll,
                )
            finally:
                if not cand:
                    worker.pause(False)
            wall_ms = (time.perf_counter() - t0) * 1e3
            pace[name] = wall_ms / max(1, n + warmup)
            timed = TimeReply.decode(reply, process().role)
            times, n_sets = list(timed.times_ms), timed.n_sets
            if len(times) != n or not all(0 < x < float("inf") for x in times):
                tampered.append(f"{name} reported {len(times)} invalid times for {n} calls")
            elif sum(times) > wall_ms + 1.0:
                tampered.append(
                    f"{name} reported {sum(times):.3f} ms of calls in {wall_ms:.3f} ms of wall time"
                )
            elif not obs.complete():
                tampered.append(f"{name}'s timed calls were not marked on the stamp socket")
            else:
                windows, gaps = _observed(obs) if obs.stamped else ((), ())
                if not obs.stamped:
                    unstamped.append(name)
                # CPU workers only: a GPU worker polls for the supervisor's answers and waits
                # for the device between calls, on the CPU.
                on_cpu = info.kind != "cuda" and obs.stamped
                trusted = timed.between_cpu_ms
                lead, edges = request_edges(obs)
                counted = on_cpu and cand and obs.cpu_ns is not None and bool(lead or not warmup)
                seen.setdefault(name, []).append(
                    Batch(
                        n,
                        warmup,
                        wall_ms,
                        tuple(times),
                        windows,
                        gaps,
                        obs.cpu_ns / 1e6 if counted else None,  # type: ignore[operator]
                        len(cores),
                        trusted if on_cpu and not cand else (),
                        lead,
                        edges,
                    )
                )
                for i, rec in obs.calls.items():
                    if cand and rec.slot >= 0 and type(n_sets) is int:
                        digests = tuple(rec.digests or ())
                        reservoir.kept[rec.slot] = KeptCall(i, n_sets, rec.seed, digests)
            return times if times else [float("nan")]

        return sample

    # Compiled (or replaced, when the compile fails) before pinning: the worker pinned is the
    # one that is timed.
    compiled = "compile" in cfg.baselines and ref.ensure_compiled(
        max(ref_s, COMPILE_TIMEOUT_S), (), ref_s
    )
    # Both workers on the same timing cores with the same intra-op thread count.
    cores, threads = timing_cores(info.kind, cfg.threads)
    for request, limit_s in ((ref.request, ref_s), (worker.request, run_s)):
        request("pin", limit_s, cpus=list(cores), threads=threads)
    contestants = {}
    if "eager" in cfg.baselines:
        eager = _batch_limited(ref.request)
        contestants["eager"] = sampler(eager, lambda: ref.worker, "eager", ref_s)
    timed = _batch_limited(worker.request)
    contestants["candidate"] = sampler(timed, lambda: worker, "candidate", run_s)
    if compiled:
        comp = _batch_limited(ref.request)
        contestants["compile"] = sampler(comp, lambda: ref.worker, "compile", ref_s)
    monitor = LoadMonitor([ref.worker.worker_pid(), worker.worker_pid()], cores)
    note = ""
    for attempt in range(2):
        judged = measure_judged(contestants, cfg.timing_config, monitor, cores, threads)
        samples = judged.samples
        found = timer_check(seen) if not tampered else TimerCheck("ok")
        if found.status != "inconclusive":
            break
        if attempt == 0:
            seen.clear()  # measured again: judged on the new batches alone
        else:
            note = f"inconclusive, measured again and accepted: {found.reason}"
    if unstamped:
        note = "this kernel does not stamp datagrams: the calls' windows were not checked"
    last = trials[-1]
    roofline = roofline_of(
        ref, samples["candidate"], info, last.input_stand_ins(), last.output_stand_ins()
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
    if not tampered and found.status == "rejected":
        tampered.append(found.reason)
    if tampered:
        return timing, Status.REJECTED, "the timer was tampered with: " + tampered[0]
    status, why = _audit_timed_calls(
        cfg, worker, ref, keys, atol, rtol, roll, reservoir.kept, limits_s=(run_s, ref_s)
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
    return timing, Status.CORRECT, ""


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
        slots = worker.request("timed_outputs", run_s, slots=[slot]).get("slots")
        if not isinstance(slots, dict):
            return Status.REJECTED, "the worker's record of its timed calls was tampered with"
        outputs = slots.get(slot)
        del slots
        if not isinstance(outputs, list) or not all(type(t) is torch.Tensor for t in outputs):
            return Status.REJECTED, "the worker did not keep the outputs of an audited call"
        shown_wrong = (
            "the outputs shown for an audited timed call are not those the worker "
            "committed to when the call ended"
        )
        kinds = [kind for kind, _ in call.digests]
        if len(outputs) != len(call.digests) or not set(kinds) <= DIGEST_KINDS:
            return Status.REJECTED, shown_wrong
        sets = keys[-call.n_sets :] if 0 < call.n_sets <= len(keys) else []
        if not sets:
            return Status.REJECTED, "the worker reported outputs of unknown timed calls"
        oracle = cfg.tolerance == "oracle"
        ref.run_timed_call(sets[call.index % len(sets)], call.seed, roll, ref_s, oracle)
        # The outputs' digests and their comparison, both in the reference worker (a tree
        # digest on its device: an int64 tree over a large output is slow on the host).
        again, shown = ref.audit(outputs, kinds, ref_s, atol=atol, rtol=rtol, mode=cfg.tolerance)
        del outputs
        if shown != list(call.digests):
            return Status.REJECTED, shown_wrong
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
