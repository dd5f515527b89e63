"""Tables of a run's metrics for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from kerneljudge.suite.metrics import GroupMetrics

__all__ = ["metrics_tables"]


def _pct(x: float) -> str:
    return f"{x * 100:.1f}"


def _p(p: float) -> str:
    return f"{p:g}"


def metrics_tables(run_id: str, groups: Sequence[GroupMetrics], label: str = "") -> list[Table]:
    """Two tables: correctness, fast_p as wins / ties / losses (percent of problems) and the
    geomean speedup per group; then pass@k and fast_p@k (wins only) per group and k. The
    first one's title carries ``label`` in brackets where it is not empty (which speedups)."""
    if not groups:
        return []
    ps = [f.p for f in groups[0].fast_p]
    by = f" ({label})" if label else ""
    head = Table(title=f"run {run_id}{by}: fast_p as wins / ties / losses, % of problems")
    for col in ("group", "problems", "samples", "correct %"):
        head.add_column(col, justify="right" if col != "group" else "left")
    for p in ps:
        if p > 0:
            head.add_column(f"fast_{_p(p)}", justify="right")
    head.add_column("geomean speedup", justify="right")
    for g in groups:
        cells = [g.group, str(g.problems), str(g.samples), _pct(g.correctness)]
        for f in g.fast_p:
            if f.p > 0:
                cells.append(f"{_pct(f.wins)} / {_pct(f.ties)} / {_pct(f.losses)}")
        geo = f"{g.geomean_speedup:.2f}x ({g.timed_correct})" if g.geomean_speedup else "-"
        head.add_row(*cells, geo)
    at_k = Table(title="pass@k and fast_p@k (unbiased estimator), %")
    for col in ("group", "k", "problems used", "pass@k"):
        at_k.add_column(col, justify="right" if col != "group" else "left")
    for p in ps:
        if p > 0:
            at_k.add_column(f"fast_{_p(p)}@k", justify="right")
    for g in groups:
        for k, value in g.pass_at_k.items():
            if value is None:  # no problem has k samples
                continue
            cells = [g.group, str(k), f"{g.problems_at_k[k]}/{g.problems}", _pct(value)]
            cells += [_pct(f.at_k[k] or 0.0) for f in g.fast_p if f.p > 0]
            at_k.add_row(*cells)
    return [head, at_k]
