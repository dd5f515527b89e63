"""The report's single HTML page: run summaries, plots, metrics tables, the per-problem
comparison, the candidate index and one section per candidate.

Every text that comes from the store (sources, reasons, names, transcripts) goes through
:func:`esc`; the page holds no script, and its Content-Security-Policy allows none and no
fetch (images are ``data:`` URIs, the style sheet is inline).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kerneljudge.suite.htmlreport.candidate import candidate_section
from kerneljudge.suite.htmlreport.data import RunData, comparisons
from kerneljudge.suite.htmlreport.markup import (
    esc,
    kv_table,
    speedup_text,
    status_badge,
    table,
)
from kerneljudge.suite.htmlreport.plots import Plot
from kerneljudge.suite.metrics import GroupMetrics
from kerneljudge.suite.store import StoredVerdict
from kerneljudge.verdict import Verdict

__all__ = ["render_page"]

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1b1b1b; background: #fff; }
header { background: #20303f; color: #fff; padding: 12px 24px; }
header h1 { margin: 0 0 6px; font-size: 20px; }
header nav a { color: #cfe3ff; margin-right: 14px; }
main { padding: 8px 24px 48px; max-width: 1400px; }
h2 { border-bottom: 2px solid #20303f; padding-bottom: 2px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #c9d1d9; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef2f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.cols { display: flex; gap: 32px; flex-wrap: wrap; align-items: flex-start; }
.cols > div { flex: 1 1 520px; min-width: 0; overflow-x: auto; }
figure { margin: 16px 0 24px; }
figure img { max-width: 100%; border: 1px solid #dde3ea; }
.note { color: #555; margin: 2px 0; }
pre { background: #f6f8fa; border: 1px solid #dde3ea; padding: 8px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-word; font-size: 12.5px; }
.cand { border-top: 1px solid #c9d1d9; margin-top: 28px; padding-top: 4px; }
.cand:target { background: #fffbe6; }
.st { font-weight: 600; padding: 0 4px; border-radius: 3px; }
.st-correct { color: #116329; background: #dafbe1; }
.st-incorrect, .st-rejected { color: #9a3412; background: #ffedd5; }
.st-compile_error, .st-runtime_error, .st-timeout { color: #a40e26; background: #ffebe9; }
.msg { border-left: 4px solid #c9d1d9; padding: 2px 10px; margin: 8px 0; }
.msg-assistant { border-color: #1f77b4; } .msg-tool { border-color: #2ca02c; }
.msg-user { border-color: #9467bd; } .msg-system { border-color: #7f7f7f; }
.role { font-weight: 600; }
a.up { font-size: 12px; margin-left: 12px; }
"""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _metrics_tables(groups: Sequence[GroupMetrics]) -> str:
    if not groups:
        return '<p class="note">No problems.</p>'
    ps = [f.p for f in groups[0].fast_p if f.p > 0]
    head = ["group", "problems", "samples", "correct %"]
    head += [f"fast_{p:g} w / t / l %" for p in ps] + ["geomean speedup"]
    rows = []
    for g in groups:
        cells = [esc(g.group), str(g.problems), str(g.samples), _pct(g.correctness)]
        cells += [
            f"{_pct(f.wins)} / {_pct(f.ties)} / {_pct(f.losses)}" for f in g.fast_p if f.p > 0
        ]
        geo = f"{g.geomean_speedup:.3g}x ({g.timed_correct})" if g.geomean_speedup else "-"
        rows.append(cells + [geo])
    first = table(head, rows, numeric=set(range(1, len(head))))
    head_k = ["group", "k", "problems used", "pass@k %"] + [f"fast_{p:g}@k %" for p in ps]
    rows_k = []
    for g in groups:
        for k, value in g.pass_at_k.items():
            if value is None:
                continue
            at = [_pct(f.at_k.get(k)) for f in g.fast_p if f.p > 0]
            rows_k.append([esc(g.group), str(k), f"{g.problems_at_k[k]}/{g.problems}", _pct(value)])
            rows_k[-1] += at
    second = (
        table(head_k, rows_k, numeric=set(range(1, len(head_k))))
        if rows_k
        else '<p class="note">No problem has enough samples for pass@k.</p>'
    )
    return first + second


def _run_summary(run: RunData) -> str:
    info = run.info
    spec = info.spec
    items = [
        ("run", esc(info.run_id)),
        ("state", esc(info.state)),
        ("created", esc(info.created_at)),
        ("model", esc(info.model or "-")),
        ("sampling", esc(json.dumps(info.sampling))),
        ("metadata", esc(json.dumps(info.metadata))),
        ("suite", esc(" ".join(map(str, spec.get("suite", []))) or "-")),
        ("candidates", esc(spec.get("candidates", "-"))),
        ("device", esc(info.device or "-")),
        ("versions", esc(json.dumps(info.versions))),
        ("problems", str(len(run.problems))),
        ("judged / planned", f"{info.judged} / {info.planned}"),
        ("correct", str(info.correct)),
    ]
    return f"<h3>{esc(info.run_id)}</h3>" + kv_table(items)


def _plot(plot: Plot) -> str:
    out = [f'<figure id="plot-{plot.key}"><h3>{esc(plot.title)}</h3>']
    if plot.png:
        out.append(f'<img src="data:image/png;base64,{plot.png}" alt="{esc(plot.alt)}">')
    out += [f'<p class="note">{esc(n)}</p>' for n in plot.notes]
    out.append("</figure>")
    return "".join(out)


def _candidate_link(run: RunData, row: StoredVerdict | None) -> str:
    if row is None:
        return "-"
    label = esc(f"{row.problem}/{row.sample}")
    return f'<a href="#{run.candidate_anchor(row)}">{label}</a>'


def _index(run: RunData) -> str:
    rows = []
    for r in run.rows:
        verdict = run.verdicts.get(r.id)
        reason = verdict.reason if isinstance(verdict, Verdict) else str(verdict)
        short = reason if len(reason) <= 100 else reason[:99] + "…"
        med, ci = speedup_text(r)
        rows.append(
            [
                _candidate_link(run, r),
                esc(r.level if r.level is not None else "-"),
                status_badge(r.status),
                med,
                ci,
                esc(short),
                "yes" if r.transcript is not None else "",
            ]
        )
    missing = [p for p in run.problems if not any(r.problem == p for r in run.rows)]
    note = (
        f'<p class="note">No candidate judged for: {esc(", ".join(missing))}.</p>'
        if missing
        else ""
    )
    head = ["candidate", "level", "status", "vs eager", "95% interval", "reason", "episode"]
    return (
        f'<h3 id="{run.anchor}-candidates">Candidates of run {esc(run.label)} '
        f"({len(run.rows)})</h3>" + table(head, rows, numeric={3, 4}) + note
    )


def _comparison(a: RunData, b: RunData) -> str:
    rows: list[list[str]] = []
    counts: dict[str, int] = {}
    for c in comparisons(a, b):
        counts[c.outcome] = counts.get(c.outcome, 0) + 1
        cells = [esc(c.problem), esc(c.level if c.level is not None else "-")]
        for run, row in ((a, c.a), (b, c.b)):
            med, ci = speedup_text(row)
            status = status_badge(row.status) if row else "no candidate"
            cells += [_candidate_link(run, row), status, med, ci]
        rows.append(cells + [esc(c.outcome)])
    head = ["problem", "level"]
    for tag, run in (("a", a), ("b", b)):
        head += [f"{tag}: best of {run.label}", f"{tag}: status", f"{tag}: vs eager", "95%"]
    summary = ", ".join(f"{n} {esc(k)}" for k, n in sorted(counts.items()))
    return (
        '<p class="note">Each problem\'s best candidate per run (a correct one with the '
        "largest median speedup, else the furthest status). <em>a faster</em> / <em>b "
        "faster</em>: one speedup's 95% interval lies wholly above the other's; "
        f"<em>tie</em>: they overlap. a = {esc(a.label)}, b = {esc(b.label)}.</p>"
        f'<p class="note">{summary}</p>' + table(head, rows, numeric={4, 5, 8, 9})
    )


def _cols(parts: Sequence[str]) -> str:
    return '<div class="cols">' + "".join(f"<div>{p}</div>" for p in parts) + "</div>"


def render_page(runs: Sequence[RunData], plots: Sequence[Plot], generated: str) -> str:
    """The whole page for one run, or two runs compared (``runs[0]`` is a, ``runs[1]`` b)."""
    title = "kerneljudge report: " + " vs ".join(r.label for r in runs)
    nav = [("runs", "Runs"), ("plots", "Plots"), ("metrics", "Metrics")]
    if len(runs) == 2:
        nav.append(("comparison", "Per-problem comparison"))
    nav += [("candidates", "Candidates")]
    nav += [(f"plot-{p.key}", p.title.split(" (")[0].split(":")[0]) for p in plots]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f'<header id="top"><h1>{esc(title)}</h1><nav>',
        "".join(f'<a href="#{k}">{esc(v)}</a>' for k, v in nav),
        f'</nav><div class="note" style="color:#cfe3ff">generated {esc(generated)}</div>',
        "</header><main>",
        '<section id="runs"><h2>Runs</h2>',
        _cols([_run_summary(r) for r in runs]),
        '</section><section id="plots"><h2>Plots</h2>',
        "".join(_plot(p) for p in plots),
        '</section><section id="metrics"><h2>Metrics</h2>',
        '<p class="note">fast_p as wins / ties / losses, % of problems: a win is a correct '
        "candidate whose speedup's 95% interval lies above p, a tie one whose interval holds "
        "p. pass@k and fast_p@k by the unbiased estimator (docs/suites.md).</p>",
    ]
    for by, heading in (("all", "Whole run"), ("level", "Per level"), ("tag", "Per tag")):
        out.append(f"<h3>{heading}</h3>")
        out.append(
            _cols([f"<h4>{esc(r.label)}</h4>" + _metrics_tables(r.metrics[by]) for r in runs])
        )
    out.append("</section>")
    if len(runs) == 2:
        out.append('<section id="comparison"><h2>Per-problem comparison</h2>')
        out.append(_comparison(runs[0], runs[1]) + "</section>")
    out.append('<section id="candidates"><h2>Candidates</h2>')
    out += [_index(r) for r in runs]
    for run in runs:
        for row in run.rows:
            out.append(candidate_section(run, row, run.verdicts.get(row.id)))
    out.append("</section></main></body></html>")
    return "\n".join(out)
