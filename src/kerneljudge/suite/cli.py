"""``kerneljudge suite run``, ``kerneljudge results ...`` and ``kerneljudge report``: suite runs,
the results store and its HTML report.

Registered on the root command by :mod:`kerneljudge.cli` (``app.add_typer``, ``app.command``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kerneljudge.errors import ConfigError, KernelJudgeError
from kerneljudge.judge.config import (
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_DEVICE,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
)

__all__ = ["report_command", "results_app", "suite_app"]

suite_app = typer.Typer(help="Judge a suite of problems against folders of candidates.")
results_app = typer.Typer(help="Query the results store: runs, verdicts, exports, metrics.")


def _console(stderr: bool = False) -> Console:
    """A console that, when not writing to a terminal, lays tables out 160 columns wide."""
    out = Console(stderr=stderr, soft_wrap=True)
    return out if out.is_terminal else Console(stderr=stderr, soft_wrap=True, width=160)


console = _console()
err_console = _console(stderr=True)

StoreOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--store",
        envvar="KERNELJUDGE_STORE",
        help="Results store file (default ~/.kerneljudge/results.db).",
    ),
]
RunArg = Annotated[str, typer.Argument(help="Run id, a unique prefix of one, or 'latest'.")]


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _open(store: Path | None) -> Any:
    from kerneljudge.suite.store import ResultsStore

    return ResultsStore(store)


def _params(items: list[str]) -> dict[str, Any]:
    """``key=value`` items; values parsed as JSON where they parse (numbers, true), else text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KernelJudgeError(f"--sampling expects key=value, not {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _row(table: Table, *cells: str) -> None:
    table.add_row(*(escape(c) for c in cells))


@suite_app.command("run")
def suite_run(
    suite: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Problems: 'bundled', a folder (a KernelBench level folder), problem files "
            "or bundled names. Not with --resume."
        ),
    ] = None,
    candidates: Annotated[
        Optional[Path], typer.Option("--candidates", "-c", help="The candidates folder.")
    ] = None,
    resume: Annotated[
        Optional[str], typer.Option(help="Continue run RESUME: judge its pairs not yet stored.")
    ] = None,
    layout: Annotated[str, typer.Option(help="auto, ours or kernelbench.")] = "auto",
    run_id: Annotated[
        Optional[str], typer.Option(help="Name the run (default: time-based).")
    ] = None,
    model: Annotated[str, typer.Option(help="The model that wrote the candidates.")] = "",
    sampling: Annotated[
        Optional[list[str]],
        typer.Option(help="A sampling parameter, key=value (repeatable), e.g. temperature=0.7."),
    ] = None,
    meta: Annotated[str, typer.Option(help="Free-form run metadata, a JSON object.")] = "{}",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = DEFAULT_DEVICE,
    trials: Annotated[int, typer.Option(min=1)] = DEFAULT_TRIALS,
    tolerance: Annotated[str, typer.Option(help="oracle or allclose.")] = DEFAULT_TOLERANCE,
    timing: Annotated[bool, typer.Option("--timing/--no-timing")] = True,
    baselines: Annotated[str, typer.Option(help="Comma list of eager, compile.")] = "eager",
    max_time: Annotated[
        Optional[float], typer.Option(help="Timing budget per candidate, seconds.")
    ] = None,
    build_timeout: float = DEFAULT_BUILD_TIMEOUT_S,
    run_timeout: Annotated[
        Optional[float],
        typer.Option(help="Seconds per candidate request (default: from the reference)."),
    ] = DEFAULT_RUN_TIMEOUT_S,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Build cache folder.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan; judge nothing.")] = False,
    store: StoreOpt = None,
) -> None:
    """Judge every (problem, candidate) pair of SUITE, storing each verdict as it comes."""
    from kerneljudge.suite.progress import SuiteProgress
    from kerneljudge.suite.runner import SuiteOptions, plan, run_pairs, start_run

    try:
        if resume is None and (not suite or candidates is None):
            _fail("give a SUITE and --candidates, or --resume RUN")
        if resume is not None and (suite or candidates is not None):
            _fail("--resume takes the suite and candidates stored with the run; give neither")
        try:
            metadata = json.loads(meta)
        except json.JSONDecodeError as exc:
            raise KernelJudgeError(f"--meta is not JSON: {exc}") from None
        if not isinstance(metadata, dict):
            raise KernelJudgeError("--meta must be a JSON object")
        options = SuiteOptions(
            device=device,
            trials=trials,
            tolerance=tolerance,
            timing=timing,
            baselines=_csv(baselines),
            max_time_s=max_time,
            build_timeout_s=build_timeout,
            run_timeout_s=run_timeout,
            cache_dir=str(cache_dir.resolve()) if cache_dir else None,
        )
        options.judge_config()  # a bad value fails here, before anything is stored
        if resume is not None and options != SuiteOptions(baselines=("eager",)):
            _fail("--resume judges with the options stored with the run; give none")
        if dry_run:
            assert suite is not None and candidates is not None
            spec = {"suite": suite, "candidates": str(candidates), "layout": layout}
            problems, pairs, unmatched = plan(spec)
            for p in problems:
                n = sum(1 for x in pairs if x.problem.name == p.name)
                console.print(
                    f"{p.name}: level {p.level}, {n} candidates", highlight=False, markup=False
                )
            console.print(
                f"{len(problems)} problems, {len(pairs)} pairs", highlight=False, markup=False
            )
            for path in unmatched:
                console.print(
                    f"[yellow]matches no problem:[/] {escape(str(path))}", highlight=False
                )
            return
        with _open(store) as db:
            if resume is None:
                assert suite is not None and candidates is not None
                run = start_run(
                    db,
                    suite=list(suite),
                    candidates=candidates,
                    layout=layout,
                    options=options,
                    run_id=run_id,
                    model=model,
                    sampling=_params(sampling or []),
                    metadata=metadata,
                )
                console.print(f"run {run} (store {db.path})", highlight=False, markup=False)
            else:
                run = db.resolve(resume)
                console.print(
                    f"resuming run {run} (store {db.path})", highlight=False, markup=False
                )
            try:
                with SuiteProgress(console) as progress:
                    summary = run_pairs(db, run, progress)
            except KeyboardInterrupt:
                err_console.print(
                    f"interrupted: continue with  kerneljudge suite run --resume {run}"
                    + (f" --store {db.path}" if store else ""),
                    highlight=False,
                    markup=False,
                )
                raise typer.Exit(130) from None
    except ConfigError as exc:
        _fail(exc.for_option())
        return
    except KernelJudgeError as exc:
        _fail(str(exc))
        return
    counts = ", ".join(f"{n} {s}" for s, n in sorted(summary.statuses.items())) or "none"
    console.print(
        f"run {run}: {summary.judged} judged now ({counts}), {summary.already} before, "
        f"{summary.planned} planned",
        highlight=False,
        markup=False,
    )
    if summary.unmatched:
        console.print(
            f"{len(summary.unmatched)} candidate files match no problem",
            style="dim",
            highlight=False,
        )
    if summary.not_judged:
        console.print(
            f"[yellow]{len(summary.not_judged)} pairs not judged[/] (resume to retry): "
            + escape("; ".join(f"{k}: {v}" for k, v in list(summary.not_judged.items())[:5])),
            highlight=False,
        )
        raise typer.Exit(1)


@results_app.command("runs")
def results_runs(
    store: StoreOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """List the runs in the store."""
    try:
        with _open(store) as db:
            runs = db.runs()
    except KernelJudgeError as exc:
        _fail(str(exc))
        return
    if json_out:
        print(json.dumps([r.to_dict() for r in runs], indent=2))
        return
    table = Table(title=f"runs in {db.path}")
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
    console.print(table)


@results_app.command("show")
def results_show(
    run: RunArg, store: StoreOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """A run's metadata and one line per stored verdict."""
    try:
        with _open(store) as db:
            info = db.run(run)
            rows = list(db.verdicts(info.run_id))
    except KernelJudgeError as exc:
        _fail(str(exc))
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
            json.loads(v.verdict_json).get("reason", "")[:70],
        )
    console.print(table)
    console.print(f"{info.judged} of {info.planned} pairs judged, {info.correct} correct")


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
        _fail(f"--format must be jsonl or parquet, not {format!r}")
    try:
        with _open(store) as db:
            run_id = db.resolve(run)
            if format == "jsonl":
                n = export_jsonl(db, run_id, output)
            else:
                n = export_parquet(db, run_id, output or Path(f"{run_id}.parquet"))
    except KernelJudgeError as exc:
        _fail(str(exc))
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
        ps = tuple(float(x) for x in _csv(p))
        ks = tuple(int(x) for x in _csv(k))
    except ValueError:
        _fail("--p takes numbers and --k integers, comma separated")
        return
    if not ps or not ks or min(ks) < 1:
        _fail("--p and --k need at least one value each; k >= 1")
    if by not in (None, "level", "tag"):
        _fail(f"--by must be level or tag, not {by!r}")
    if timing not in TIMINGS:
        _fail(f"--timing must be {' or '.join(TIMINGS)}, not {timing!r}")
    try:
        with _open(store) as db:
            info = db.run(run)
            verdicts = list(db.verdicts(info.run_id))  # read once: the samples and the count
            samples = [v.as_sample(timing) for v in verdicts]
            groups = compute_metrics(db.problems(info.run_id), samples, by=by, ps=ps, ks=ks)
            missing = sum(v.replays_missing() for v in verdicts) if timing == "graph" else 0
    except KernelJudgeError as exc:
        _fail(str(exc))
        return
    if json_out:
        out = {"run_id": info.run_id, "timing": timing, "replays_missing": missing}
        print(json.dumps({**out, "groups": [g.to_dict() for g in groups]}))
        return
    label = "" if timing == "launched" else "graph-replay speedups"
    if missing:
        label += f"; {missing} verdict(s) without replays counted by their launched calls"
    for table in metrics_tables(info.run_id, groups, label):
        console.print(table)


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
        _fail(str(exc))
        return
    err_console.print(f"report -> {path}", highlight=False, markup=False)
