"""``kerneljudge problems lint``: the problem lint as a typer sub-app.

The root CLI registers :data:`app` (``app.add_typer(lint_cli.app, name="problems")``); the
printing and the exit code live in :func:`lint_command` so that they can be called and tested
without typer.
"""

from __future__ import annotations

import json

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from kerneljudge.cli.output import make_console, print_table
from kerneljudge.lint import CHECK_NAMES, LintCheck, LintReport, lint_paths

__all__ = ["app", "lint_command", "render_reports"]

app = typer.Typer(help="Work with problem suites.", no_args_is_help=True)

_MARKS = {
    "pass": "[green]ok[/]",
    "fail": "[bold red]X[/]",
    "warn": "[yellow]![/]",
    "skip": "[dim]·[/]",
    "none": "[dim]-[/]",
}
#: Short column headers, so that the table fits a 110-column terminal; a legend follows it.
_LABELS = {
    "load": "load",
    "metadata": "meta",
    "output_shape": "shape",
    "finite": "fin",
    "deterministic": "det",
    "inputs_unchanged": "pure",
    "magnitude": "mag",
    "nulls_fail": "nulls",
    "inputs_matter": "ins",
    "weights_matter": "wts",
    "weights_vary": "vary",
    "counts": "cnt",
    "fits": "fits",
    "not_launch_bound": "lnch",
}


def _mark(check: LintCheck | None) -> str:
    if check is None:
        return _MARKS["none"]
    if check.skipped:
        return _MARKS["skip"]
    if check.passed:
        return _MARKS["pass"]
    return _MARKS["fail"] if check.required else _MARKS["warn"]


def render_reports(reports: list[LintReport], console: Console) -> None:
    """Print one table row per report, then the detail of every failure and warning."""
    table = Table(
        title="problem lint",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    table.add_column("problem", no_wrap=True)
    table.add_column("set", no_wrap=True)
    for name in CHECK_NAMES:
        table.add_column(_LABELS.get(name, name), justify="center", no_wrap=True)
    table.add_column("result", no_wrap=True)
    for r in reports:
        verdict = "[green]pass[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(
            r.problem,
            r.shape_set or "-",
            *(_mark(r.check(n)) for n in CHECK_NAMES),
            f"{verdict} {r.duration_s:.1f}s",
        )
    print_table(console, table)
    console.print(
        "[dim]"
        + ", ".join(f"{_LABELS[n]} = {n}" for n in CHECK_NAMES if _LABELS[n] != n)
        + "; X failed, ! warning, · not applicable, - not run[/]"
    )
    for r in reports:
        for c in r.failures + r.warnings:
            level = "[bold red]FAIL[/]" if c.required else "[yellow]warn[/]"
            console.print(
                f"{level} {r.problem} [bold]{c.name}[/]: {c.detail}",
                highlight=False,
                soft_wrap=True,
            )
    failed = sum(not r.passed for r in reports)
    summary = f"{len(reports) - failed}/{len(reports)} problems pass"
    console.print(f"[bold red]{summary}[/]" if failed else f"[green]{summary}[/]")


def lint_command(
    specs: list[str],
    shape_set: str | None,
    device: str,
    json_out: bool,
    console: Console | None = None,
) -> int:
    """Lint the problems ``specs`` names and print a table (or JSON); returns the exit code.

    Args:
        specs: bundled names, ``.py`` files or folders; empty lints every bundled problem.
        shape_set: the shape set to lint at; None picks ``tiny``, else each problem's smallest.
        device: ``"cpu"`` or ``"cuda[:i]"``.
        json_out: print a JSON list of reports instead of the table.
        console: where to print (default: stdout).

    Returns:
        0 when every problem passes every required check; 2 when a problem cannot be used at
        all (its ``load`` check failed: it does not import, or its probe or reference failed);
        1 otherwise.
    """
    console = console or make_console()

    errors = make_console(stderr=True)

    def progress(r: LintReport) -> None:  # a long lint shows where it is (on stderr)
        mark = "pass" if r.passed else "FAIL"
        errors.print(f"[dim]{r.problem}: {mark} ({r.duration_s:.1f} s)[/]")

    reports = lint_paths(list(specs), shape_set=shape_set, device=device, progress=progress)
    if json_out:
        console.print_json(json.dumps([r.to_dict() for r in reports]))
    else:
        render_reports(reports, console)
    if any(r.checks and r.checks[0].name == "load" and not r.checks[0].passed for r in reports):
        return 2
    return 0 if reports and all(r.passed for r in reports) else 1


@app.command("lint")
def lint(
    specs: list[str] = typer.Argument(
        None, help="Problem names, .py files or folders (default: every bundled problem)."
    ),
    shape_set: str | None = typer.Option(
        None,
        "--shape-set",
        "-s",
        envvar="KERNELJUDGE_SHAPE_SET",
        help="Shape set to lint at (default: 'tiny', else each problem's smallest).",
    ),
    device: str = typer.Option(
        "cpu", "--device", "-d", envvar="KERNELJUDGE_DEVICE", help="cpu or cuda[:i]."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Prove that problems are sound: deterministic, not passable by null candidates, every
    input and weight matters, outputs well above tolerance, and they fit in memory and time."""
    raise typer.Exit(lint_command(specs or [], shape_set, device, json_out))
