"""What the HTML report shows, read from the results store: a run's verdicts, its metrics, the
fast_p curve, the best candidate per problem and the roofline points.

Everything here is plain data; :mod:`.plots` draws it and :mod:`.page` lays it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kerneljudge.suite.metrics import (
    DEFAULT_KS,
    DEFAULT_PS,
    GroupMetrics,
    Sample,
    compute_metrics,
)
from kerneljudge.suite.store import ResultsStore, RunInfo, StoredVerdict
from kerneljudge.verdict import Status, Verdict

__all__ = [
    "STATUS_ORDER",
    "Comparison",
    "Curve",
    "RooflinePoint",
    "RunData",
    "best_per_problem",
    "compare_problem",
    "comparisons",
    "fast_p_grid",
    "fast_p_curve",
    "load_run",
    "roofline_points",
]

#: Statuses from the furthest stage reached to the nearest (the order of the bar chart's
#: legend is its reverse: ``Status``'s own order).
STATUS_ORDER: tuple[str, ...] = tuple(s.value for s in reversed(Status))


@dataclass
class RunData:
    """One run as the report shows it.

    Attributes:
        label: the run id.
        anchor: the prefix of this run's anchors in the page (``run1``, ``run2``).
        info: the run's row with its counts.
        rows: its stored verdicts, in the order stored.
        verdicts: verdict id -> the typed verdict, or the text of why it could not be read.
        problems: every problem of the suite -> ``(level, tags)``.
        metrics: ``all``, ``level`` and ``tag`` -> the metrics groups (defaults of
            :mod:`kerneljudge.suite.metrics`: p in 0, 1, 1.5, 2 and k in 1, 5, 10).
    """

    label: str
    anchor: str
    info: RunInfo
    rows: list[StoredVerdict]
    verdicts: dict[int, Verdict | str]
    problems: dict[str, tuple[int | None, tuple[str, ...]]]
    metrics: dict[str, list[GroupMetrics]] = field(default_factory=dict)

    @property
    def samples(self) -> list[Sample]:
        return [r.as_sample() for r in self.rows]

    def candidate_anchor(self, row: StoredVerdict) -> str:
        """The id of ``row``'s section in the page."""
        return f"{self.anchor}-v{row.id}"


def load_run(store: ResultsStore, run: str, anchor: str) -> RunData:
    """Read run ``run`` (an id, a unique prefix or ``latest``) and compute its metrics.

    Raises:
        StoreError: no such run, or several match.
    """
    info = store.run(run)
    rows = list(store.verdicts(info.run_id))
    verdicts: dict[int, Verdict | str] = {}
    for row in rows:
        try:
            verdicts[row.id] = row.verdict
        except (ValueError, KeyError, TypeError) as exc:
            verdicts[row.id] = f"the stored verdict cannot be read: {exc}"
    problems = store.problems(info.run_id)
    for row in rows:  # a verdict stored for a problem the run's plan does not list
        problems.setdefault(row.problem, (row.level, row.tags))
    data = RunData(info.run_id, anchor, info, rows, verdicts, problems)
    samples = data.samples
    for by in (None, "level", "tag"):
        data.metrics[by or "all"] = compute_metrics(
            problems, samples, by=by, ps=DEFAULT_PS, ks=DEFAULT_KS
        )
    return data


@dataclass(frozen=True)
class Curve:
    """fast_p over a grid of thresholds: ``wins[i]`` and ``ties[i]`` are shares of problems
    (per-problem means, in [0, 1]) at ``ps[i]``, by :func:`~kerneljudge.suite.metrics.classify`."""

    ps: tuple[float, ...]
    wins: tuple[float, ...]
    ties: tuple[float, ...]


def fast_p_grid(runs: Sequence[RunData], points: int = 201) -> tuple[float, ...]:
    """``points`` thresholds from 0 to ``max(2, 1.1 * largest upper interval bound)``, at most
    20: the range where some correct candidate's outcome changes."""
    highs = [r.speedup_hi for run in runs for r in run.rows if r.speedup_hi is not None]
    top = min(max([2.0] + [1.1 * h for h in highs]), 20.0)
    return tuple(top * i / (points - 1) for i in range(points))


def fast_p_curve(run: RunData, ps: Sequence[float]) -> Curve:
    """The run's fast_p (wins) and its ties at every ``p`` of ``ps``, over all its problems."""
    (group,) = compute_metrics(run.problems, run.samples, ps=ps, ks=(1,))
    return Curve(
        tuple(ps), tuple(f.wins for f in group.fast_p), tuple(f.ties for f in group.fast_p)
    )


def _rank(row: StoredVerdict) -> tuple[int, int, float]:
    """Sort key of the best candidate: the furthest status, then timed, then fastest."""
    stage = STATUS_ORDER.index(row.status) if row.status in STATUS_ORDER else len(STATUS_ORDER)
    return (stage, 0 if row.speedup is not None else 1, -(row.speedup or 0.0))


def best_per_problem(run: RunData) -> dict[str, StoredVerdict]:
    """Problem -> its best candidate: a correct one with the largest median speedup (timed
    before untimed), else the one whose status reached the furthest stage."""
    out: dict[str, StoredVerdict] = {}
    for row in run.rows:
        held = out.get(row.problem)
        if held is None or _rank(row) < _rank(held):
            out[row.problem] = row
    return out


@dataclass(frozen=True)
class Comparison:
    """One problem in two runs: each run's best candidate (None: none judged) and the word
    that compares them (see :func:`compare_problem`)."""

    problem: str
    level: int | None
    a: StoredVerdict | None
    b: StoredVerdict | None
    outcome: str


def compare_problem(a: StoredVerdict | None, b: StoredVerdict | None) -> str:
    """Which best candidate is faster, by the same interval rule as the metrics' ties.

    Both correct and timed: ``b faster`` when b's lower 95% bound is above a's upper bound,
    ``a faster`` the other way round, else ``tie`` (the intervals overlap). Otherwise
    ``only a correct``, ``only b correct``, ``both correct, not timed`` or
    ``neither correct``.
    """
    ok_a = a is not None and a.status == "correct"
    ok_b = b is not None and b.status == "correct"
    if ok_a and ok_b:
        assert a is not None and b is not None
        a_lo, a_hi, b_lo, b_hi = a.speedup_lo, a.speedup_hi, b.speedup_lo, b.speedup_hi
        if a_lo is None or a_hi is None or b_lo is None or b_hi is None:
            return "both correct, not timed"
        if b_lo > a_hi:
            return "b faster"
        if a_lo > b_hi:
            return "a faster"
        return "tie"
    if ok_a:
        return "only a correct"
    if ok_b:
        return "only b correct"
    return "neither correct"


def comparisons(a: RunData, b: RunData) -> list[Comparison]:
    """Every problem of either run (a's order first), with each run's best candidate."""
    best_a, best_b = best_per_problem(a), best_per_problem(b)
    names = list(a.problems) + [p for p in b.problems if p not in a.problems]
    out = []
    for name in names:
        level = (a.problems.get(name) or b.problems.get(name) or (None, ()))[0]
        ra, rb = best_a.get(name), best_b.get(name)
        out.append(Comparison(name, level, ra, rb, compare_problem(ra, rb)))
    return out


@dataclass(frozen=True)
class RooflinePoint:
    """One timed candidate on the roofline.

    Attributes:
        intensity: FLOPs over bytes of one call (FLOP/byte).
        tflops: achieved TFLOP/s (FLOPs over the candidate's median time).
        peak_tflops: the device's peak for the problem's dtype, TFLOP/s, derived as achieved
            over ``compute_fraction`` (None: the verdict carries no peak, e.g. on the CPU).
        peak_gbps: the device's peak memory bandwidth, GB/s, achieved over
            ``bandwidth_fraction`` (None likewise).
    """

    run: str
    label: str
    status: str
    device: str
    intensity: float
    tflops: float
    peak_tflops: float | None
    peak_gbps: float | None


def roofline_points(run: RunData) -> tuple[list[RooflinePoint], list[str]]:
    """The run's timed candidates that carry FLOP and byte counts, and one line for each timed
    candidate left off the roofline saying why."""
    points: list[RooflinePoint] = []
    skipped: list[str] = []
    for row in run.rows:
        verdict = run.verdicts.get(row.id)
        if not isinstance(verdict, Verdict) or verdict.timing is None:
            continue
        name = f"{row.problem}/{row.sample}"
        rl = verdict.timing.roofline
        if rl is None:
            skipped.append(f"{name}: the verdict has no roofline figures")
            continue
        if not rl.flops or not rl.bytes or not rl.achieved_tflops:
            missing = "FLOP count" if not rl.flops else "byte count"
            skipped.append(f"{name}: the problem gives no {missing}")
            continue
        peak_tf = rl.achieved_tflops / rl.compute_fraction if rl.compute_fraction else None
        peak_bw = (
            rl.achieved_gbps / rl.bandwidth_fraction
            if rl.bandwidth_fraction and rl.achieved_gbps
            else None
        )
        device = verdict.device.name if verdict.device else row.device
        points.append(
            RooflinePoint(
                run.label,
                name,
                row.status,
                device or "unknown device",
                rl.flops / rl.bytes,
                rl.achieved_tflops,
                peak_tf,
                peak_bw,
            )
        )
    return points, skipped
