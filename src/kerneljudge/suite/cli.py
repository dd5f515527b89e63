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
    from kerneljudge.suite.progress import REASON_WIDTH, SuiteProgress
    from kerneljudge.suite.runner import SuiteOptions, plan, run_pairs, start_run

    try:
        if resume is None and (not suite or candidates is None):
            fail("give a SUITE and --candidates, or --resume RUN")
        if resume is not None and (suite or candidates is not None):
            fail("--resume takes the suite and candidates stored with the run; give neither")
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
        with _open(store, create=resume is None) as db:
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
