"""``kerneljudge results ...`` and ``kerneljudge report``: the results store's runs, verdicts,
exports and metrics, and its HTML report.

Registered on the root command by :mod:`kerneljudge.cli` (through :mod:`kerneljudge.suite.cli`).
Tables are rich's on a terminal and aligned plain lines into a file or a pipe
(:func:`kerneljudge.cli.output.print_table`); a verdict's reason is cut to the table's column
on a terminal (the cut ends in "…") and printed whole elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kerneljudge.cli.output import clip, print_table
from kerneljudge.errors import KernelJudgeError
from kerneljudge.suite.cli_shared import RunArg, StoreOpt, console, csv, err_console, fail
from kerneljudge.suite.cli_shared import open_store as _open

__all__ = ["REASON_WIDTH", "report_command", "results_app"]

results_app = typer.Typer(help="Query the results store: runs, verdicts, exports, metrics.")

#: Characters of a verdict's reason that ``results show`` prints on a terminal.
REASON_WIDTH = 70


def _row(table: Table, *cells: str) -> None:
    table.add_row(*(escape(c) for c in cells))


@results_app.command("runs")
def results_runs(
    store: StoreOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """List the runs in the store."""
    try:
        with _open(store) as db:
            runs = db.runs()
    except KernelJudgeError as exc:
        fail(str(exc))
        return
    if json_out:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
        return
    table = Table(title=escape(f"runs in {db.path}"))
    for col in ("run", "created", "state", "model", "problems", "judged", "correct"):
        table.add_column(col, no_wrap=col != "model")
    for r in runs:
        _row(
            table,
            r.run_id,
            r.created_at,
            r.state,
            r.model or "-",
            str(r.problems),
            f"{r.judged}/{r.planned}",
            str(r.correct),
        )
    print_table(console, table)


@results_app.command("show")
def results_show(
    run: RunArg, store: StoreOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """A run's metadata and one line per stored verdict (the reason whole into a file or a
    pipe, cut to its column with "…" on a terminal)."""
    try:
        with _open(store) as db:
            info = db.run(run)
            rows = list(db.verdicts(info.run_id))
    except KernelJudgeError as exc:
        fail(str(exc))
        return
    if json_out:
        out = info.to_dict()
        out["verdicts"] = [v.to_dict(source=False) for v in rows]
        print(json.dumps(out, indent=2))
        return
    console.print(f"[bold]run {escape(info.run_id)}[/]  {info.state}, created {info.created_at}")
    console.print(
        f"model {info.model or '-'}  sampling {json.dumps(info.sampling)}  "
        f"metadata {json.dumps(info.metadata)}",
        highlight=False,
        markup=False,
    )
    console.print(
        f"suite {' '.join(info.spec.get('suite', []))}  candidates "
        f"{info.spec.get('candidates', '-')}  versions {json.dumps(info.versions)}",
        highlight=False,
        markup=False,
    )
    width = REASON_WIDTH if console.is_terminal else None
    table = Table()
    for col in ("problem", "sample", "backend", "status", "vs eager", "95% CI", "reason"):
        table.add_column(col, overflow="fold")
    for v in rows:
        ci = f"{v.speedup_lo:.2f}-{v.speedup_hi:.2f}" if v.speedup_lo is not None else "-"
        _row(
            table,
            v.problem,
            v.sample,
            v.backend,
            v.status,
            f"{v.speedup:.2f}x" if v.speedup is not None else "-",
            ci,
            clip(json.loads(v.verdict_json).get("reason", ""), width),
        )
    print_table(console, table)
    console.print(
        f"{info.judged} of {info.planned} pairs judged, {info.correct} correct",
        highlight=False,
        markup=False,
    )


@results_app.command("export")
def results_export(
    run: RunArg,
    format: Annotated[str, typer.Option("--format", "-f", help="jsonl or parquet.")] = "jsonl",
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="File (jsonl default: stdout).")
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Write a run's verdicts (with run metadata and candidate sources) as JSONL or Parquet."""
    from kerneljudge.suite.export import export_jsonl, export_parquet

    if format not in ("jsonl", "parquet"):
        fail(f"--format must be jsonl or parquet, not {format!r}")
    try:
        with _open(store) as db:
            run_id = db.resolve(run)
            if format == "jsonl":
                n = export_jsonl(db, run_id, output)
            else:
                n = export_parquet(db, run_id, output or Path(f"{run_id}.parquet"))
    except KernelJudgeError as exc:
        fail(str(exc))
        return
    if output is not None or format == "parquet":
        err_console.print(
            f"{n} verdicts -> {output or f'{run_id}.parquet'}", highlight=False, markup=False
        )


@results_app.command("metrics")
def results_metrics(
    run: RunArg,
    by: Annotated[Optional[str], typer.Option(help="level or tag.")] = None,
    p: Annotated[str, typer.Option("--p", help="fast_p thresholds, comma list.")] = "0,1,1.5,2",
    k: Annotated[str, typer.Option("--k", help="pass@k sample counts, comma list.")] = "1,5,10",
    timing: Annotated[
        str,
        typer.Option(
            help="Speedups of the launched calls (launched) or of the CUDA-graph replays "
            "(graph: the device's time alone; a verdict without replays keeps its launched "
            "calls' speedup, and the table says how many)."
        ),
    ] = "launched",
    store: StoreOpt = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Correctness, fast_p (wins / ties / losses by the 95% interval), pass@k, fast_p@k and
    the geometric-mean speedup of a run, overall or per level or tag."""
    from kerneljudge.suite.metrics import compute_metrics
    from kerneljudge.suite.migrations import TIMINGS
    from kerneljudge.suite.report import metrics_tables

    try:
        ps = tuple(float(x) for x in csv(p))
        ks = tuple(int(x) for x in csv(k))
    except ValueError:
        fail("--p takes numbers and --k integers, comma separated")
        return
    if not ps or not ks or min(ks) < 1:
        fail("--p and --k need at least one value each; k >= 1")
    if by not in (None, "level", "tag"):
        fail(f"--by must be level or tag, not {by!r}")
    if timing not in TIMINGS:
        fail(f"--timing must be {' or '.join(TIMINGS)}, not {timing!r}")
    try:
        with _open(store) as db:
            info = db.run(run)
            verdicts = list(db.verdicts(info.run_id))  # read once: the samples and the count
            samples = [v.as_sample(timing) for v in verdicts]
            groups = compute_metrics(db.problems(info.run_id), samples, by=by, ps=ps, ks=ks)
            missing = sum(v.replays_missing() for v in verdicts) if timing == "graph" else 0
    except KernelJudgeError as exc:
        fail(str(exc))
        return
    if json_out:
        out = {"run_id": info.run_id, "timing": timing, "replays_missing": missing}
        print(json.dumps({**out, "groups": [g.to_dict() for g in groups]}))
        return
    label = "" if timing == "launched" else "graph-replay speedups"
    if missing:
        label += f"; {missing} verdict(s) without replays counted by their launched calls"
    for table in metrics_tables(info.run_id, groups, label):
        print_table(console, table)


def report_command(
    run: RunArg,
    compare: Annotated[
        Optional[str], typer.Option(help="A second run to show beside RUN, problem by problem.")
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(help="The HTML file (default report-<run>.html, or report-<run>-vs-<run2>)."),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Write one self-contained HTML page of a run (plots, metrics, every candidate's verdict,
    source and episode transcript), or of two runs compared. Needs matplotlib (the report
    extra)."""
    from kerneljudge.suite.htmlreport import write_report

    try:
        with _open(store) as db:
            path = write_report(db, run, compare, out)
    except KernelJudgeError as exc:
        fail(str(exc))
        return
    err_console.print(f"report -> {path}", highlight=False, markup=False)
