"""The report's plots, drawn with matplotlib's object API (no pyplot, no global backend) and
embedded as base64 PNG.

One figure per question: how the speedups of correct candidates are distributed, fast_p over
p with its ties band, each candidate's speedup with its 95% interval, where candidates sit on
the roofline, and how many candidates ended in each status. With two runs every figure draws
both, in two colours.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kerneljudge.suite.htmlreport.data import (
    STATUS_ORDER,
    RunData,
    fast_p_curve,
    fast_p_grid,
    roofline_points,
)

__all__ = ["Plot", "all_plots"]

_COLOURS = ("#1f77b4", "#d62728")
_MAX_ROWS = 120  # candidates drawn in the per-candidate speedup figure
_MAX_LABELS = 30  # roofline points named in the figure


@dataclass
class Plot:
    """One figure for the page.

    Attributes:
        key: the figure's anchor (``plot-<key>``).
        title: its heading.
        png: the PNG file, base64 encoded; empty when there was nothing to draw.
        alt: what the figure shows, in words (the image's alt text).
        notes: sentences shown under the figure (what was left out and why).
    """

    key: str
    title: str
    png: str
    alt: str
    notes: list[str] = field(default_factory=list)


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _correct_speedups(run: RunData) -> list[float]:
    return [r.speedup for r in run.rows if r.status == "correct" and r.speedup and r.speedup > 0]


def speedup_distribution(runs: Sequence[RunData]) -> Plot:
    """Histogram (log-spaced bins) and ECDF of the correct candidates' median eager speedups."""
    plot = Plot(
        "distribution",
        "Speedup distribution (correct candidates)",
        "",
        "Histogram and empirical CDF of the median eager speedups of correct candidates, "
        "log x axis",
    )
    values = {run.label: _correct_speedups(run) for run in runs}
    everything = [v for vs in values.values() for v in vs]
    if not everything:
        plot.notes.append("No correct candidate was timed: there is no speedup to draw.")
        return plot
    lo, hi = min(everything) / 1.15, max(everything) * 1.15
    bins = [lo * (hi / lo) ** (i / 20) for i in range(21)]
    fig = _figure(10, 3.6)
    hist, ecdf = fig.subplots(1, 2)
    for colour, run in zip(_COLOURS, runs):
        vs = sorted(values[run.label])
        if not vs:
            plot.notes.append(f"Run {run.label} has no timed correct candidate.")
            continue
        label = f"{run.label} ({len(vs)})"
        hist.hist(vs, bins=bins, histtype="step", linewidth=2, color=colour, label=label)
        ys = [(i + 1) / len(vs) for i in range(len(vs))]
        ecdf.step([vs[0]] + vs, [0.0] + ys, where="post", color=colour, label=label)
    for ax, ylabel in ((hist, "candidates"), (ecdf, "share of timed correct candidates")):
        ax.set_xscale("log")
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("speedup over eager PyTorch (median, log scale)")
        ax.set_ylabel(ylabel)
        ax.legend(loc="best", fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
    hist.yaxis.get_major_locator().set_params(integer=True)
    hist.set_title("histogram")
    ecdf.set_title("empirical CDF")
    plot.png = _png(fig)
    return plot


def fast_p_over_p(runs: Sequence[RunData]) -> Plot:
    """fast_p (wins) over p, with the band up to wins + ties (the CI-aware tie rule)."""
    plot = Plot(
        "fastp",
        "fast_p over p",
        "",
        "fast_p (share of problems whose candidate is correct and faster than p times eager "
        "beyond its 95% interval) over p, with the ties band",
    )
    ps = fast_p_grid(runs)
    fig = _figure(10, 4.2)
    ax = fig.subplots()
    for colour, run in zip(_COLOURS, runs):
        curve = fast_p_curve(run, ps)
        wins = [100 * w for w in curve.wins]
        upper = [100 * (w + t) for w, t in zip(curve.wins, curve.ties)]
        ax.plot(ps, wins, color=colour, linewidth=2, label=f"{run.label}: fast_p (wins)")
        ax.fill_between(
            ps, wins, upper, color=colour, alpha=0.2, step=None, label=f"{run.label}: + ties"
        )
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(0, ps[-1])
    ax.set_ylim(0, 102)
    ax.set_xlabel("p (speedup threshold over eager PyTorch)")
    ax.set_ylabel("% of problems")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    plot.png = _png(fig)
    plot.notes.append(
        "A correct candidate wins at p when the lower end of its speedup's 95% interval is "
        "above p, ties when the interval holds p (shaded), loses when it lies below p; "
        "a correct candidate without a timed speedup ties at every p > 0. At p = 0 the "
        "curve is the correctness rate."
    )
    return plot


def per_candidate_speedups(runs: Sequence[RunData]) -> Plot:
    """Every timed correct candidate's median speedup with its 95% interval (error bars)."""
    plot = Plot(
        "speedups",
        "Speedup per candidate, with 95% intervals",
        "",
        "Median eager speedup of each timed correct candidate with its 95% interval, log x axis",
    )
    keys: list[tuple[str, str]] = []
    for run in runs:
        for r in run.rows:
            key = (r.problem, r.sample)
            if r.status == "correct" and r.speedup is not None and key not in keys:
                keys.append(key)
    if not keys:
        plot.notes.append("No correct candidate was timed: there is no speedup to draw.")
        return plot
    keys.sort()
    if len(keys) > _MAX_ROWS:
        plot.notes.append(
            f"{len(keys)} timed correct candidates; the first {_MAX_ROWS} by problem name are "
            "drawn (the tables list all)."
        )
        keys = keys[:_MAX_ROWS]
    row_of = {k: i for i, k in enumerate(keys)}
    fig = _figure(10, 1.4 + 0.32 * len(keys) * (1 + 0.3 * (len(runs) - 1)))
    ax = fig.subplots()
    for n, (colour, run) in enumerate(zip(_COLOURS, runs)):
        offset = 0.0 if len(runs) == 1 else (0.18 if n == 0 else -0.18)
        xs: list[float] = []
        ys: list[float] = []
        err: list[list[float]] = [[], []]
        for r in run.rows:
            key = (r.problem, r.sample)
            if key not in row_of or r.status != "correct" or r.speedup is None:
                continue
            lo = r.speedup_lo if r.speedup_lo is not None else r.speedup
            hi = r.speedup_hi if r.speedup_hi is not None else r.speedup
            xs.append(r.speedup)
            ys.append(len(keys) - 1 - row_of[key] + offset)
            err[0].append(max(r.speedup - lo, 0.0))
            err[1].append(max(hi - r.speedup, 0.0))
        ax.errorbar(
            xs, ys, xerr=err, fmt="o", color=colour, capsize=3, markersize=5, label=run.label
        )
    ax.set_yticks(range(len(keys)), [f"{p}/{s}" for p, s in reversed(keys)])
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("speedup over eager PyTorch (median and 95% interval, log scale)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    plot.png = _png(fig)
    return plot


def roofline(runs: Sequence[RunData]) -> Plot:
    """Achieved TFLOP/s over arithmetic intensity, under each device's roofs when the
    verdicts carry its peaks."""
    plot = Plot(
        "roofline",
        "Roofline: achieved against peak",
        "",
        "Achieved TFLOP/s of each timed candidate over its arithmetic intensity (FLOP/byte), "
        "log-log, under the device's compute and memory-bandwidth roofs where known",
    )
    all_points = []
    for run in runs:
        points, skipped = roofline_points(run)
        all_points += [(run, p) for p in points]
        for line in skipped:
            plot.notes.append(f"Not on the roofline ({run.label}): {line}.")
    if not all_points:
        plot.notes.insert(0, "No timed candidate carries both a FLOP and a byte count.")
        return plot
    fig = _figure(10, 4.8)
    ax = fig.subplots()
    xs = [p.intensity for _, p in all_points]
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    roofs = {(p.device, p.peak_tflops, p.peak_gbps) for _, p in all_points if p.peak_tflops}
    for device, peak_tf, peak_bw in sorted(roofs, key=str):
        grid = [x_lo * (x_hi / x_lo) ** (i / 100) for i in range(101)]
        bw = peak_bw if peak_bw else math.inf
        ax.plot(
            grid,
            [min(peak_tf, x * bw / 1e3) for x in grid],
            color="black",
            linewidth=1.5,
            label=f"roof: {device}",
        )
    no_peaks = sorted({p.device for _, p in all_points if not p.peak_tflops})
    if no_peaks:
        plot.notes.append(
            "No peak figures in the verdicts for "
            + ", ".join(no_peaks)
            + " (the judge takes peaks from datasheets for GPUs only): no roof is drawn, the "
            "points show achieved throughput."
        )
    markers = {"correct": "o", "rejected": "x"}
    for colour, run in zip(_COLOURS, runs):
        for status in sorted({p.status for r, p in all_points if r is run}):
            pts = [p for r, p in all_points if r is run and p.status == status]
            ax.scatter(
                [p.intensity for p in pts],
                [p.tflops for p in pts],
                color=colour,
                marker=markers.get(status, "s"),
                label=f"{run.label}: {status} ({len(pts)})",
                zorder=3,
            )
    if len(all_points) <= _MAX_LABELS:
        for _, p in all_points:
            ax.annotate(p.label, (p.intensity, p.tflops), xytext=(4, 4),
                        textcoords="offset points", fontsize="x-small")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    plot.png = _png(fig)
    return plot


def statuses(runs: Sequence[RunData]) -> Plot:
    """Candidates per verdict status (and pairs planned but not judged), one bar per run."""
    plot = Plot(
        "statuses",
        "Statuses",
        "",
        "Number of candidates per verdict status, one bar per run",
    )
    names = list(reversed(STATUS_ORDER))
    counts = []
    for run in runs:
        c = {s: 0 for s in names}
        for r in run.rows:
            c[r.status] = c.get(r.status, 0) + 1
        c["not judged"] = max(run.info.planned - run.info.judged, 0)
        counts.append(c)
    names = [s for s in names + ["not judged"] if any(c.get(s) for c in counts)] or names
    names += sorted({s for c in counts for s in c if c[s] and s not in names})
    fig = _figure(10, 3.6)
    ax = fig.subplots()
    width = 0.8 / len(runs)
    for n, (colour, run, c) in enumerate(zip(_COLOURS, runs, counts)):
        xs = [i - 0.4 + width * (n + 0.5) for i in range(len(names))]
        bars = ax.bar(xs, [c.get(s, 0) for s in names], width, color=colour, label=run.label)
        ax.bar_label(bars, fontsize="small")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("candidates")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    plot.png = _png(fig)
    return plot


def all_plots(runs: Sequence[RunData]) -> list[Plot]:
    """Every figure of the report, in page order."""
    return [
        speedup_distribution(runs),
        fast_p_over_p(runs),
        per_candidate_speedups(runs),
        roofline(runs),
        statuses(runs),
    ]
