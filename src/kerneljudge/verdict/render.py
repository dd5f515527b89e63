"""Rendering verdicts for a terminal (rich) and as the one-line summaries the seeds' users read."""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kerneljudge.cli.output import plain_table
from kerneljudge.verdict import Status, TimingResult, Verdict

__all__ = ["STATUS_STYLE", "noise_line", "render_verdict", "verdict_summary"]

STATUS_STYLE = {
    Status.CORRECT: "bold green",
    Status.INCORRECT: "bold red",
    Status.COMPILE_ERROR: "bold red",
    Status.RUNTIME_ERROR: "bold red",
    Status.TIMEOUT: "bold yellow",
    Status.REJECTED: "bold magenta",
}


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}"


def verdict_summary(v: Verdict) -> str:
    """One line: status, problem, and the eager speedup (``, host noisy`` when the timing was
    flagged noisy; ``, replay Nx`` with the graph replays' speedup where measured) or the
    reason."""
    head = f"{v.status.value} {v.problem}"
    if v.timing and v.timing.speedup("eager"):
        s = v.timing.speedup("eager")
        assert s is not None
        noisy = ", host noisy" if v.timing.host and v.timing.host.noisy else ""
        g = v.timing.graph.speedup("eager") if v.timing.graph else None
        replay = f", replay {g.median:.2f}x" if g else ""
        ci = f"95% CI {s.ci95[0]:.2f}-{s.ci95[1]:.2f}"
        return f"{head}: {s.median:.2f}x vs eager ({ci}{noisy}{replay})"
    return f"{head}: {v.reason}" if v.reason else head


def noise_line(tm: TimingResult) -> str:
    """One plain line on a timing flagged noisy (empty when it is not)."""
    if not (tm.host and tm.host.noisy):
        return ""
    passes = f"after {tm.passes} passes" if tm.passes > 1 else "in its one pass"
    return (
        f"host noisy while timing ({passes}): {'; '.join(tm.host.noise_reasons)}; "
        "the speedup intervals are widened"
    )


def graph_lines(tm: TimingResult) -> list[str]:
    """Plain lines on the CUDA-graph replays (:class:`~kerneljudge.verdict.GraphTiming`): each
    speedup by replay with its interval, each contestant's share of launched time spent waiting
    for the host, the host-drift note, and why a contestant was not captured."""
    g = tm.graph
    if g is None:
        return []
    out = [
        f"graph replay: speedup over {sp.baseline} {sp.median:.3f}x "
        f"(95% CI {sp.ci95[0]:.3f}-{sp.ci95[1]:.3f}; device time, independent of the host)"
        for sp in g.speedups
    ]
    if g.host_share:
        shares = ", ".join(f"{n} {share:.0%}" for n, share in g.host_share.items())
        out.append(f"time waiting for the host in launched calls: {shares}")
    if g.note:
        out.append(g.note)
    out += [f"graph replay of {n}: not timed ({why})" for n, why in g.not_captured.items()]
    if g.error:
        out.append(f"graph replay: {g.error}")
    return out


def _pinning(tm: TimingResult) -> str:
    if not tm.cores:
        return ""
    cores = ",".join(str(c) for c in tm.cores)
    plural = "s" if tm.threads != 1 else ""
    return f"timed on core{'s' if len(tm.cores) > 1 else ''} {cores}, {tm.threads} thread{plural}"


def _head(text: str, limit: int) -> str:
    """The whole lines of ``text`` within its first ``limit`` characters, then a line saying
    how many lines were left out (``text`` itself when it fits)."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    cut = cut if cut > 0 else limit
    return text[:cut] + f"\n... {text[cut:].strip().count(chr(10)) + 1} more lines"


def render_verdict(v: Verdict, console: Console | None = None) -> None:
    """Print a verdict as panels and tables; where ``console`` is not a terminal, as plain
    lines, each whole (see :mod:`kerneljudge.cli.output`)."""
    console = console or Console()
    title = Text(v.status.value.upper(), style=STATUS_STYLE[v.status])
    lines = [Text.assemble(("problem ", "dim"), v.problem, ("  backend ", "dim"), v.backend)]
    if v.device:
        lines.append(Text.assemble(("device ", "dim"), f"{v.device.name} ({v.device.kind})"))
    if v.reason:
        lines.append(Text(v.reason))
    if v.build:
        b = v.build
        lines.append(
            Text.assemble(
                ("build ", "dim"),
                "ok" if b.ok else "failed",
                f"  {b.duration_s:.1f} s",
                ("  (cached)" if b.cached else ""),
            )
        )
    parts: list[RenderableType] = [Text("\n").join(lines)]
    if v.build and not v.build.ok and v.build.log:
        # The shaped log starts with the errors at the candidate's lines: show its start.
        log = _head(v.build.log, 3000)
        parts.append(Panel(Text(log), title="compiler errors", border_style="red"))
    if v.check:
        t = Table(
            title=f"correctness ({v.check.mode} rule, atol={v.check.atol:g} rtol={v.check.rtol:g})"
        )
        for col in (
            "trial",
            "shapes",
            "result",
            "max_abs_err",
            "mean_abs_err",
            "max_rel_err",
            "allclose",
            "err vs fp64",
            "bound",
        ):
            t.add_column(
                col, justify="right" if col not in ("result", "shapes") else "left", no_wrap=True
            )
        for tr in v.check.trials:
            t.add_row(
                str(tr.index),
                tr.shape_set,
                Text("pass", style="green") if tr.passed else Text("FAIL", style="red"),
                _fmt(tr.max_abs_err),
                _fmt(tr.mean_abs_err),
                _fmt(tr.max_rel_err),
                "yes" if tr.allclose else "no",
                _fmt(tr.oracle_err),
                _fmt(tr.oracle_bound),
            )
        parts.append(t)
        bad = next((tr for tr in v.check.trials if not tr.passed), None)
        if bad and bad.mismatches:
            mm = Table(title=f"first mismatches (trial {bad.index})")
            for col in ("index", "expected", "got"):
                mm.add_column(col, justify="right")
            for bad_at in bad.mismatches:
                mm.add_row(str(bad_at.index), f"{bad_at.expected:.6g}", f"{bad_at.got:.6g}")
            parts.append(mm)
    if v.timing:
        tm = v.timing
        passes = f", {tm.passes} passes" if tm.passes > 1 else ""
        t = Table(
            title=f"timing ({tm.clock}, {tm.rounds} rounds{passes}, stopped by {tm.stop_reason})"
        )
        for col in ("contestant", "median ms", "IQR ms", "95% CI of median", "min ms", "samples"):
            t.add_column(col, justify="left" if col == "contestant" else "right")
        for m in tm.measurements:
            t.add_row(
                m.name,
                f"{m.median_ms:.4f}",
                f"{m.iqr_ms:.4f}",
                f"{m.ci95_ms[0]:.4f}-{m.ci95_ms[1]:.4f}",
                f"{m.min_ms:.4f}",
                str(m.samples),
            )
        parts.append(t)
        s = Table(title="speedup (baseline median / candidate median)")
        for col in ("baseline", "speedup", "95% CI"):
            s.add_column(col, justify="right")
        for sp in tm.speedups:
            s.add_row(sp.baseline, f"{sp.median:.3f}x", f"{sp.ci95[0]:.3f}-{sp.ci95[1]:.3f}")
        for baseline, why in tm.baseline_errors.items():
            s.add_row(baseline, "-", why)
        parts.append(s)
        for line in (_pinning(tm), noise_line(tm), *graph_lines(tm)):
            if line:
                parts.append(Text(line))
        r = tm.roofline
        if r:
            frac = ""
            if r.bandwidth_fraction is not None or r.compute_fraction is not None:
                bw, fl = _pct(r.bandwidth_fraction), _pct(r.compute_fraction)
                frac = f"  ({bw}% of peak bandwidth, {fl}% of peak FLOP/s; "
                frac += f"floor {_fmt(r.floor_ms, '.4g')} ms)"
            parts.append(
                Text(
                    f"roofline: {_fmt(r.achieved_gbps, '.1f')} GB/s, "
                    f"{_fmt(r.achieved_tflops, '.3f')} TFLOP/s{frac}"
                )
            )
    parts += [Text(f"reduced for want of memory: {line}") for line in v.reductions]
    if v.worker_log and v.status in (Status.RUNTIME_ERROR, Status.TIMEOUT):
        parts.append(
            Panel(Text(v.worker_log[-2000:]), title="worker output", border_style="yellow")
        )
    if not console.is_terminal:
        _print_plain(console, [title, *parts])
        return
    console.print(Panel(parts[0], title=title, expand=False))
    for part in parts[1:]:
        console.print(part)


def _print_plain(console: Console, parts: list[RenderableType]) -> None:
    """Texts, tables and panels as plain lines (a panel: its title in a rule, then its text)."""
    for part in parts:
        if isinstance(part, Table):
            lines = plain_table(part)
        elif isinstance(part, Panel):
            body = part.renderable
            text = body.plain if isinstance(body, Text) else str(body)
            lines = [f"--- {part.title} ---", *text.splitlines()]
        else:
            lines = part.plain.splitlines() if isinstance(part, Text) else [str(part)]
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
