"""The verdict: the typed, versioned result of judging one candidate.

Every dataclass here is frozen and round-trips through JSON (:meth:`Verdict.to_json` /
:meth:`Verdict.from_json`), except that a NaN float is written as ``null`` and read back as
None. ``SCHEMA_VERSION`` changes whenever a field changes meaning or is removed; readers refuse
a newer major version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kerneljudge.verdict._json import from_jsonable, to_jsonable

__all__ = [
    "SCHEMA_VERSION",
    "BuildResult",
    "CheckResult",
    "CompilerMessage",
    "DeviceInfo",
    "GraphTiming",
    "HostLoad",
    "Measurement",
    "Mismatch",
    "RequestLimits",
    "Roofline",
    "Speedup",
    "Status",
    "TimingResult",
    "TrialResult",
    "Verdict",
    "decode",
]

SCHEMA_VERSION = "1.6"


class Status(str, Enum):
    """Outcome of judging a candidate, from worst to best stage reached."""

    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    INCORRECT = "incorrect"
    REJECTED = "rejected"
    CORRECT = "correct"


@dataclass(frozen=True)
class CompilerMessage:
    """One compiler diagnostic.

    Attributes:
        file: the file the compiler named (e.g. ``cuda.cu``, ``main.cpp``, or the candidate).
        line, column: 1-based position in ``file`` (None when the compiler gave none).
        severity: ``"error"`` or ``"warning"``.
        message: the diagnostic text.
        candidate_line: the 1-based line of the candidate file the code came from, when it could
            be traced back (source given as string literals in the candidate).
    """

    file: str
    line: int | None
    column: int | None
    severity: str
    message: str
    candidate_line: int | None = None


@dataclass(frozen=True)
class BuildResult:
    """Outcome of the build stage.

    Attributes:
        ok: the candidate compiled and its module imported in the build worker; for the
            ``torch`` and ``triton`` backends no build worker runs, and ``ok`` is True unless a
            static check (empty source, syntax error) failed.
        backend: ``cuda``, ``cpp``, ``triton`` or ``torch``.
        cached: the build came from the cache (no compiler ran).
        duration_s: wall time of the build as first done (seconds), also for cached builds.
        cache_key: sha256 of the source, the backend and the toolchain fingerprint
            (:meth:`kerneljudge.build.BuildCache.key`); empty after a static check failed.
        messages: compiler diagnostics, errors first.
        log: on failure, the shaped log: errors (mapped to candidate lines) first, then the
            raw log's tail; on success, the last 4000 characters of the build worker's output.
        timed_out: the build hit its time limit (its process group was killed).
        rejected: the candidate's import broke the sandbox's rules during the build.
    """

    ok: bool
    backend: str
    cached: bool = False
    duration_s: float = 0.0
    cache_key: str = ""
    messages: tuple[CompilerMessage, ...] = ()
    log: str = ""
    timed_out: bool = False
    rejected: bool = False


@dataclass(frozen=True)
class Mismatch:
    """An output element that failed: its index, the reference value and the candidate's."""

    index: tuple[int, ...]
    expected: float
    got: float


@dataclass(frozen=True)
class TrialResult:
    """One correctness trial (fresh inputs from a per-trial seed).

    Errors are measured against the reference at the problem's dtype; ``max_rel_err`` divides by
    ``max(|reference|, atol)`` so that near-zero reference values do not dominate. The oracle
    fields measure against the float64 evaluation of the reference (see :mod:`kerneljudge.check`).
    """

    index: int
    passed: bool
    reason: str = ""
    max_abs_err: float = 0.0
    mean_abs_err: float = 0.0
    max_rel_err: float = 0.0
    allclose: bool = False
    oracle_err: float | None = None
    reference_err: float | None = None
    oracle_bound: float | None = None
    mismatches: tuple[Mismatch, ...] = ()
    shape_set: str = "public"


@dataclass(frozen=True)
class CheckResult:
    """The correctness stage: all trials, the rule that decided, and its tolerances."""

    passed: bool
    trials: tuple[TrialResult, ...]
    mode: str
    atol: float
    rtol: float

    @property
    def n_passed(self) -> int:
        return sum(t.passed for t in self.trials)

    def worst(self, name: str) -> float:
        """The largest value of a per-trial error field (``max_abs_err``, ...) over all trials."""
        values = [getattr(t, name) for t in self.trials if getattr(t, name) is not None]
        return max(values, default=0.0)


@dataclass(frozen=True)
class Measurement:
    """Timing samples of one contestant, summarised.

    Times are per forward call in milliseconds. ``ci95_ms`` is a distribution-free 95%
    confidence interval of the median from the order statistics of the samples (binomial
    ranks ``n/2 -+ 1.96 sqrt(n)/2``; Conover, *Practical Nonparametric Statistics*, 3rd ed., 3.2).
    """

    name: str
    samples: int
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    mean_ms: float
    ci95_ms: tuple[float, float]

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


@dataclass(frozen=True)
class Speedup:
    """Baseline median time over candidate median time, with its 95% interval.

    Attributes:
        baseline: the baseline's name (``eager``, ``compile``).
        median: ``median(baseline samples) / median(candidate samples)``.
        ci95: the reported interval: it holds ``ci95_samples`` and ``ci95_rounds``, and on a
            noisy host more (see :func:`kerneljudge.timing.speedups`).
        ci95_samples: the percentile-bootstrap interval over the samples (they taken as iid).
            Added in schema 1.3.
        ci95_rounds: the order-statistic interval of the median of the per-round ratios
            (between-round drift); None with fewer than 2 rounds. Added in schema 1.3.
    """

    baseline: str
    median: float
    ci95: tuple[float, float]
    ci95_samples: tuple[float, float] | None = None
    ci95_rounds: tuple[float, float] | None = None


@dataclass(frozen=True)
class HostLoad:
    """The host's load while the timing stage sampled, and whether it made the timing noisy.

    Read by the supervisor from ``/proc`` at the start and end of each timing pass, and between
    batches (:mod:`kerneljudge.timing.hostload`); the rule that sets ``noisy`` and its thresholds
    are in :func:`kerneljudge.timing.hostload.noise_reasons`. Shares are fractions in [0, 1]; None
    where the host does not expose the reading. Added in schema 1.3.

    Attributes:
        cpus: CPUs the judge may use.
        seconds: wall time the readings span (all timing passes), seconds.
        run_queue: runnable tasks besides the judge's own, median over the readings taken
            between batches (``/proc/loadavg``'s running count, less the reader).
        run_queue_max: the largest of those readings.
        cpu_pressure: share of the span in which some task waited for a CPU, host-wide
            (``/proc/pressure/cpu``, ``some``).
        steal: share of the timing cores' time stolen by the hypervisor (``/proc/stat``).
        iowait: share of the timing cores' time idle waiting for I/O (``/proc/stat``).
        preemptions: involuntary context switches of the timed workers' threads, summed over
            all their threads (``/proc/<pid>/task/*/status``, ``nonvoluntary_ctxt_switches``).
        preemptions_per_s: ``preemptions`` per second of the span, divided by the intra-op
            thread count of one timed worker (the contestants run one at a time).
        run_delay: time the timed workers' threads spent runnable but waiting for a CPU
            (``/proc/<pid>/task/*/schedstat``), summed over their threads, as a share of the
            span times the intra-op thread count of one timed worker (at most 1).
        round_spread: contestant -> interquartile range of its per-round batch medians over
            their median (how far its speed moved between rounds).
        noisy: a reading passed its threshold; the speedups' intervals are widened.
        noise_reasons: one plain sentence per reading past its threshold.
    """

    cpus: int
    seconds: float
    run_queue: float | None = None
    run_queue_max: int | None = None
    cpu_pressure: float | None = None
    steal: float | None = None
    iowait: float | None = None
    preemptions: int | None = None
    preemptions_per_s: float | None = None
    run_delay: float | None = None
    round_spread: dict[str, float] = field(default_factory=dict)
    noisy: bool = False
    noise_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Roofline:
    """Achieved throughput of the candidate against the device's peaks.

    Attributes:
        flops, bytes: work of one call (from the problem's counts).
        achieved_tflops, achieved_gbps: flops / time and bytes / time.
        compute_fraction, bandwidth_fraction: achieved over peak (None without a device entry).
        floor_ms: the physical floor max(bytes / peak bandwidth, flops / peak rate).
        below_floor: the upper end of the 95% interval of the candidate's median is under the
            floor (by the table's margin): it cannot have done the work, and the verdict is
            ``rejected``. (Before schema 1.3: the median itself.)
        source: where the peak figures come from.
    """

    flops: float | None
    bytes: float | None
    achieved_tflops: float | None
    achieved_gbps: float | None
    compute_fraction: float | None = None
    bandwidth_fraction: float | None = None
    floor_ms: float | None = None
    below_floor: bool = False
    source: str = ""


@dataclass(frozen=True)
class GraphTiming:
    """The timing of CUDA-graph replays of each contestant's forward, beside its launched calls
    (:mod:`kerneljudge.timing.graph_pass`). A replay's time is the device's: the host only
    launches the graph. Added in schema 1.5.

    Attributes:
        measurements: one per contestant captured (``candidate``, ``eager``, ``compile``), ms
            per replay.
        speedups: one per baseline captured, when the candidate was captured (when it was
            not, the captured baselines are timed alone: measurements without speedups); each
            ``ci95`` at least ±2% of its median (:data:`kerneljudge.timing.graph_pass.
            REPLAY_FLOOR`, and where that comes from).
        rounds, stop_reason: as :class:`TimingResult`'s, for the replays.
        not_captured: contestant -> why it could not be replayed (one line).
        host_share: contestant -> ``1 - replay median / launched median``, within [0, 1]: the
            share of a launched call's time in which the device waited for the host.
        host_range: baseline -> where the launched-call speedup may move if the host's side
            of each side's calls (``launched - replay`` time) took up to ``host_drift`` times
            longer or shorter, each side on its own
            (:func:`kerneljudge.timing.graph_pass.host_range`), the lower end first.
        host_drift: the factor ``host_range`` assumes
            (:data:`kerneljudge.timing.graph_pass.HOST_DRIFT`, and where it comes from).
        note: one sentence when a launched-call speedup moves with the host by more than 2%
            either way over ``host_range``; else empty.
        capture_s: contestant -> seconds its capture and replay check took.
        seconds: wall seconds of the whole graph pass (captures, replays, their audit), part
            of the verdict's ``timing`` stage.
        timer_note: as :class:`TimingResult`'s, for the replays.
        error: why the replays were not reported although contestants were captured (the
            reference's worker failed during them); empty otherwise.
    """

    measurements: tuple[Measurement, ...] = ()
    speedups: tuple[Speedup, ...] = ()
    rounds: int = 0
    stop_reason: str = ""
    not_captured: dict[str, str] = field(default_factory=dict)
    host_share: dict[str, float] = field(default_factory=dict)
    host_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    host_drift: float = 0.0
    note: str = ""
    capture_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    timer_note: str = ""
    error: str = ""

    def measurement(self, name: str) -> Measurement | None:
        return next((m for m in self.measurements if m.name == name), None)

    def speedup(self, baseline: str) -> Speedup | None:
        return next((s for s in self.speedups if s.baseline == baseline), None)


@dataclass(frozen=True)
class TimingResult:
    """The timing stage: reference baselines and candidate, measured alternately.

    Attributes:
        clock: ``"cuda_event"`` or ``"monotonic"``.
        measurements: one per contestant: ``candidate``, ``eager``, and ``compile`` when timed.
        speedups: one per baseline.
        rounds: alternation rounds run (each round times every contestant once per iteration
            batch, in rotating order).
        stop_reason: ``"precision"`` (CI of every median within the target), ``"max_time"`` or
            ``"max_samples"``.
        l2_flush_bytes: size of the buffer written between timed calls (0 on CPU).
        roofline: achieved throughput against the device's peaks, when the problem has counts.
        baseline_errors: baseline -> why a baseline that was asked for is not timed (e.g.
            ``{"compile": "compile did not finish within 600 s"}``). Added in schema 1.2.
        host: the host's load while timing and whether it made the timing noisy (None when
            not measured). Added in schema 1.3.
        passes: timing passes run: 2 when the first was noisy and the judge measured again
            (the samples are then the second pass's if it was quiet, else both passes').
            Added in schema 1.3.
        threads: torch intra-op threads of both timed workers (0: not set). Added in 1.3.
        cores: the CPU cores both timed workers were pinned to (empty: not pinned). Added in
            schema 1.3.
        timer_note: why the timer audit (``kerneljudge.timing.timer_rule``) was undecided twice and
            the times were accepted anyway; empty when it decided. Added in schema 1.3.
        graph: the same contestants timed by CUDA-graph replay, and how host-bound each
            launched call is (None: not asked for, or not a CUDA device). Added in schema 1.5.
    """

    clock: str
    measurements: tuple[Measurement, ...]
    speedups: tuple[Speedup, ...]
    rounds: int
    stop_reason: str
    l2_flush_bytes: int = 0
    roofline: Roofline | None = None
    baseline_errors: dict[str, str] = field(default_factory=dict)
    host: HostLoad | None = None
    passes: int = 1
    threads: int = 0
    cores: tuple[int, ...] = ()
    timer_note: str = ""
    graph: GraphTiming | None = None

    def measurement(self, name: str) -> Measurement | None:
        return next((m for m in self.measurements if m.name == name), None)

    def speedup(self, baseline: str) -> Speedup | None:
        return next((s for s in self.speedups if s.baseline == baseline), None)


@dataclass(frozen=True)
class RequestLimits:
    """The time limits of a verdict's requests to its workers (seconds), and where they came
    from (:class:`kerneljudge.check.limits.RunLimits`). Added in schema 1.4.

    Attributes:
        source: ``derived`` (from the reference's measured call and the bytes moved) or
            ``explicit`` (the configured ``run_timeout_s``).
        load_s: limit of the candidate's import.
        run_s: shape set -> limit of each request to the candidate's worker on it (a trial;
            the floor of a timing batch's limit).
        reference_s: shape set -> limit of each request to the reference's worker on it.
        reference_call_s: shape set -> the reference's measured call: the least wall time of
            its trial runs on the supervisor's clock.
        floor_s, cap_s, factor: the derivation's floor, cap and factor
            (``max(floor, min(cap, factor x call) + seconds per GiB moved)``).
    """

    source: str
    load_s: float
    run_s: dict[str, float] = field(default_factory=dict)
    reference_s: dict[str, float] = field(default_factory=dict)
    reference_call_s: dict[str, float] = field(default_factory=dict)
    floor_s: float = 0.0
    cap_s: float = 0.0
    factor: float = 0.0


@dataclass(frozen=True)
class DeviceInfo:
    """The device judged on. ``memory_bytes``/``l2_bytes`` are 0 when unknown (CPU)."""

    kind: str
    name: str
    capability: str = ""
    sm_count: int = 0
    memory_bytes: int = 0
    l2_bytes: int = 0


@dataclass(frozen=True)
class Verdict:
    """Everything the judge concluded about one candidate on one problem.

    ``status`` is decided by the furthest stage the candidate reached; ``reason`` says in one
    line why it is not ``correct`` (empty when it is).
    """

    status: Status
    reason: str
    problem: str
    candidate_sha256: str
    backend: str
    build: BuildResult | None = None
    check: CheckResult | None = None
    timing: TimingResult | None = None
    device: DeviceInfo | None = None
    versions: dict[str, str] = field(default_factory=dict)
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    worker_log: str = ""
    #: Wall seconds of each stage the verdict went through, in order: ``build`` (a cache
    #: lookup when cached), ``worker`` (taking a started worker), ``reference`` (waiting for
    #: the reference's trial outputs), ``load`` (importing the candidate in its worker),
    #: ``trials``, ``timing`` (the alternating measurement and the audits of timed calls).
    #: Added in schema 1.1.
    stage_s: dict[str, float] = field(default_factory=dict)
    #: The confinement layers the candidate's processes ran under, outermost first (see
    #: :func:`kerneljudge.worker.confine.layers`): ``pdeathsig``, ``pid_namespace``,
    #: ``net_namespace``, ``mount_namespace``, ``user_namespace``, ``private_dev_shm``,
    #: ``landlock_abi_N``, ``scheduling_locked``, ``audit_hook``. Added in schema 1.3.
    confinement: tuple[str, ...] = ()
    #: The time limits of its worker requests (None: the verdict ended before the reference's
    #: trials were run, e.g. at its build). Added in schema 1.4.
    limits: RequestLimits | None = None
    #: What the judge reduced for want of memory, one line each (empty: nothing): trials run
    #: by the reference only when compared instead of kept ahead, float64 oracles computed on
    #: the host instead of the device. Added in schema 1.6.
    reductions: tuple[str, ...] = ()
    schema_version: str = SCHEMA_VERSION

    @property
    def correct(self) -> bool:
        return self.status is Status.CORRECT

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists, the status its string)."""
        return to_jsonable(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """Rebuild a verdict from :meth:`to_dict` output.

        Raises:
            ValueError: the data's schema major version is newer than this reader's.
        """
        version = str(data.get("schema_version", "1.0"))
        if int(version.split(".")[0]) > int(SCHEMA_VERSION.split(".")[0]):
            raise ValueError(f"verdict schema {version} is newer than supported {SCHEMA_VERSION}")
        return from_jsonable(cls, data)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        return cls.from_dict(json.loads(text))


def decode(tp: type, data: Any) -> Any:
    """Rebuild a dataclass of this module (e.g. :class:`BuildResult`) from its JSON form."""
    return from_jsonable(tp, data)
