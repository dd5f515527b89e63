"""``kerneljudge suite run``: judge a suite of problems into the results store.

Registered on the root command by :mod:`kerneljudge.cli` (``app.add_typer``, ``app.command``),
with ``kerneljudge results ...`` and ``kerneljudge report`` from
:mod:`kerneljudge.suite.results_cli`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from kerneljudge.cli.output import clip
from kerneljudge.errors import ConfigError, KernelJudgeError
from kerneljudge.judge.config import (
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_DEVICE,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
)
from kerneljudge.suite.cli_shared import StoreOpt, console, csv, err_console, fail
from kerneljudge.suite.cli_shared import open_store as _open
from kerneljudge.suite.results_cli import report_command, results_app

__all__ = ["report_command", "results_app", "suite_app"]

suite_app = typer.Typer(help="Judge a suite of problems against folders of candidates.")


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


def _dry_run(
    store: Path | None,
    resume: str | None,
    suite: list[str],
    candidates: Path | None,
    layout: str,
    run_id: str | None,
) -> None:
    """Print the plan of a new run (refusing what starting it would refuse: a taken
    ``run_id``) or of run ``resume`` (its earlier plan and the candidates folder now), each
    problem with its candidates and what is left to judge; write nothing.

    Raises:
        KernelJudgeError: the suite, the candidates or the store cannot be read, the run is
            unknown, or ``run_id`` is taken.
    """
    from kerneljudge.suite.runner import RunPlan, plan, plan_run
    from kerneljudge.suite.store import default_store_path

    if resume is not None:
        with _open(store) as db:
            info = db.run(resume)
            run_plan = plan_run(db, info.run_id, info.spec)
        console.print(
            f"run {info.run_id} ({info.state}), store {db.path}", markup=False, highlight=False
        )
    else:
        spec = {"suite": suite, "candidates": str(candidates), "layout": layout}
        problems, pairs, unmatched = plan(spec)
        run_plan = RunPlan(problems, pairs, unmatched, {p.key: str(p.path) for p in pairs}, set())
        if run_id is not None and (store or default_store_path()).exists():
            with _open(store) as db:
                if db.has_run(run_id):
                    raise KernelJudgeError(f"a run named {run_id!r} is already in {db.path}")
    for p in run_plan.problems:
        keys = [k for k in run_plan.planned if k[0] == p.name]
        line = f"{p.name}: level {p.level}, {len(keys)} candidates"
        if resume is not None:
            line += f", {sum(1 for k in keys if k in run_plan.done)} judged"
        console.print(line, markup=False, highlight=False)
    line = f"{len(run_plan.problems)} problems, {len(run_plan.planned)} pairs"
    if resume is not None:
        judged = len(run_plan.done & set(run_plan.planned))
        missing = len(run_plan.missing)
        line += f": {judged} judged, {len(run_plan.todo)} to judge"
        line += f", {missing} that cannot be judged (below)" if missing else ""
    console.print(line, markup=False, highlight=False)
    for label, why in run_plan.missing.items():
        console.print(f"[yellow]not judged:[/] {escape(label)}: {escape(why)}", highlight=False)
    for path in run_plan.unmatched:
        console.print(f"[yellow]matches no problem:[/] {escape(str(path))}", highlight=False)


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
    """Judge every (problem, candidate) pair of SUITE, storing each verdict as it comes.
    Ctrl-C, SIGTERM or SIGHUP stops it, leaving the run resumable (exit 130, 143 or 129)."""
    from kerneljudge.stopping import StopSignals, exit_status
    from kerneljudge.suite.progress import REASON_WIDTH, SuiteProgress
    from kerneljudge.suite.runner import (
        SuiteOptions,
        new_run_id,
        release,
        run_pairs,
        start_run,
    )

    try:
        if resume is None and (not suite or candidates is None):
            fail("give a SUITE and --candidates, or --resume RUN")
        if resume is not None and (suite or candidates is not None):
            fail("--resume takes the suite and candidates stored with the run; give neither")
        given = [
            name
            for name, value, default in (
                ("--run-id", run_id, None),
                ("--model", model, ""),
                ("--sampling", sampling or None, None),
                ("--meta", meta, "{}"),
                ("--layout", layout, "auto"),
            )
            if value != default
        ]
        if resume is not None and given:
            fail(f"--resume keeps the run's own {', '.join(given)}; give none of them")
        try:
            metadata = json.loads(meta)
        except json.JSONDecodeError as exc:
            raise KernelJudgeError(f"--meta is not JSON: {exc}") from None
        if not isinstance(metadata, dict):
            raise KernelJudgeError("--meta must be a JSON object")
        params = _params(sampling or [])
        options = SuiteOptions(
            device=device,
            trials=trials,
            tolerance=tolerance,
            timing=timing,
            baselines=csv(baselines),
            max_time_s=max_time,
            build_timeout_s=build_timeout,
            run_timeout_s=run_timeout,
            cache_dir=str(cache_dir.resolve()) if cache_dir else None,
        )
        options.judge_config()  # a bad value fails here, before anything is stored
        if resume is not None and options != SuiteOptions(baselines=("eager",)):
            fail("--resume judges with the options stored with the run; give none")
        if dry_run:
            _dry_run(store, resume, suite or [], candidates, layout, run_id)
            return
        run: str | None = None
        try:
            with StopSignals(), _open(store, create=resume is None) as db:
                try:
                    if resume is None:
                        assert suite is not None and candidates is not None
                        # Named before it is stored: a signal while it is planned marks it.
                        run = run_id or new_run_id()
                        start_run(
                            db,
                            suite=list(suite),
                            candidates=candidates,
                            layout=layout,
                            options=options,
                            run_id=run,
                            model=model,
                            sampling=params,
                            metadata=metadata,
                        )
                        console.print(f"run {run} (store {db.path})", highlight=False, markup=False)
                    else:
                        run = db.resolve(resume)
                        console.print(
                            f"resuming run {run} (store {db.path})", highlight=False, markup=False
                        )
                    with SuiteProgress(console) as progress:
                        summary = run_pairs(db, run, progress)
                except KeyboardInterrupt:
                    if run is not None:
                        release(db, run)
                    raise
        except KeyboardInterrupt as exc:  # a stop signal: the run is left resumable
            err_console.print(
                "interrupted"
                + (f": continue with  kerneljudge suite run --resume {run}" if run else "")
                + (f" --store {db.path}" if run and store else ""),
                highlight=False,
                markup=False,
            )
            raise typer.Exit(exit_status(exc)) from None
    except ConfigError as exc:
        fail(exc.for_option())
        return
    except KernelJudgeError as exc:
        fail(str(exc))
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
        width = REASON_WIDTH if console.is_terminal else None
        shown = list(summary.not_judged.items())[:5]
        more = len(summary.not_judged) - len(shown)
        console.print(
            f"[yellow]{len(summary.not_judged)} pairs not judged[/] (resume to retry): "
            + escape("; ".join(f"{k}: {clip(v, width)}" for k, v in shown))
            + (f" (and {more} more)" if more else ""),
            highlight=False,
        )
        raise typer.Exit(1)
