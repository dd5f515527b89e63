"""The ``kerneljudge`` command line: parse, call the API, print. Every option also reads an
environment variable named ``KERNELJUDGE_<OPTION>``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.syntax import Syntax
from rich.table import Table

from kerneljudge.cli.output import StageReporter, make_console, print_table
from kerneljudge.errors import ConfigError, KernelJudgeError
from kerneljudge.judge.config import (
    DEFAULT_BASELINES,
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_DEVICE,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
)
from kerneljudge.stopping import STOP_SIGNALS, StopSignals, exit_status

if TYPE_CHECKING:
    from kerneljudge.judge import JudgeConfig

app = typer.Typer(
    name="kerneljudge",
    help="Build, check and time custom GPU kernels against their PyTorch reference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
problems_app = typer.Typer(help="List, show and lint problems.", invoke_without_command=True)
app.add_typer(problems_app, name="problems")

# On a terminal rich fits the window; into a file or a pipe every line is printed whole.
console = make_console()
err_console = make_console(stderr=True)


def _env(name: str) -> str:
    return f"KERNELJUDGE_{name.upper()}"


def version_line() -> str:
    """``kerneljudge X (torch Y, CUDA Z, Python W)``: the installed package's version (its
    metadata; the source tree's ``__version__`` when it is not installed) and torch's."""
    import importlib.metadata
    import platform

    import torch

    try:
        version = importlib.metadata.version("kerneljudge")
    except importlib.metadata.PackageNotFoundError:
        from kerneljudge import __version__ as version
    cuda = torch.version.cuda or "none"
    return (
        f"kerneljudge {version} (torch {torch.__version__}, CUDA {cuda}, "
        f"Python {platform.python_version()})"
    )


def _print_version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the versions of kerneljudge, torch, CUDA and Python, and exit.",
        ),
    ] = False,
) -> None:
    """Build, check and time custom GPU kernels against their PyTorch reference."""


DeviceOpt = Annotated[str, typer.Option(envvar=_env("device"), help="auto, cpu, cuda or cuda:N.")]
CacheOpt = Annotated[
    Optional[Path], typer.Option(envvar=_env("cache_dir"), help="Build cache folder.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the verdict as JSON.")]
BackendOpt = Annotated[
    Optional[str],
    typer.Option(envvar=_env("backend"), help="cuda, cpp, triton or torch (default: detect)."),
]


def _csv(text: str) -> tuple[str, ...]:
    """The items of a comma list, stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _message(exc: KernelJudgeError) -> str:
    """The one-line message of ``exc``; a bad configuration value names its option."""
    return exc.for_option() if isinstance(exc, ConfigError) else str(exc)


def _fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _config(**kw: object) -> JudgeConfig:
    from kerneljudge.judge import JudgeConfig
    from kerneljudge.timing import TimingConfig

    timing_kw = {k: kw.pop(k) for k in ("max_time_s", "rel_precision") if kw.get(k) is not None}
    kw = {k: v for k, v in kw.items() if v is not None}
    return JudgeConfig(timing_config=TimingConfig(**timing_kw), **kw)  # type: ignore[arg-type]


@app.command("eval")
def eval_command(
    candidate: Annotated[Path, typer.Argument(help="The candidate file defining ModelNew.")],
    problem: Annotated[
        str,
        typer.Option(
            "--problem", "-p", envvar=_env("problem"), help="Bundled problem name or problem file."
        ),
    ],
    backend: BackendOpt = None,
    device: DeviceOpt = DEFAULT_DEVICE,
    trials: Annotated[int, typer.Option(envvar=_env("trials"), min=1)] = DEFAULT_TRIALS,
    tolerance: Annotated[
        str, typer.Option(envvar=_env("tolerance"), help="oracle (float64 rule) or allclose.")
    ] = DEFAULT_TOLERANCE,
    atol: Annotated[Optional[float], typer.Option(envvar=_env("atol"))] = None,
    rtol: Annotated[Optional[float], typer.Option(envvar=_env("rtol"))] = None,
    timing: Annotated[bool, typer.Option("--timing/--no-timing", envvar=_env("timing"))] = True,
    baselines: Annotated[
        str, typer.Option(envvar=_env("baselines"), help="Comma list of eager, compile.")
    ] = ",".join(DEFAULT_BASELINES),
    graph_timing: Annotated[
        bool,
        typer.Option(
            "--graph/--no-graph",
            envvar=_env("graph"),
            help="On a GPU, also time CUDA-graph replays (device time) and show host-boundness.",
        ),
    ] = True,
    shape_sets: Annotated[
        str, typer.Option(envvar=_env("shape_sets"), help="Comma list; 'all' for every set.")
    ] = "public",
    max_time: Annotated[
        Optional[float], typer.Option(envvar=_env("max_time"), help="Timing budget, seconds.")
    ] = None,
    build_timeout: Annotated[
        float, typer.Option(envvar=_env("build_timeout"))
    ] = DEFAULT_BUILD_TIMEOUT_S,
    run_timeout: Annotated[
        Optional[float],
        typer.Option(
            envvar=_env("run_timeout"),
            help="Seconds per candidate request (default: from the reference's call time).",
        ),
    ] = DEFAULT_RUN_TIMEOUT_S,
    seed: Annotated[
        Optional[int], typer.Option(envvar=_env("seed"), help="Fix the run seed (default: secret).")
    ] = None,
    memory_budget: Annotated[
        int,
        typer.Option(
            envvar=_env("memory_budget"),
            min=0,
            help="MiB the judge may use to relay one trial (0: the host's available memory).",
        ),
    ] = 0,
    cache_dir: CacheOpt = None,
    json_out: JsonOpt = False,
    server: Annotated[
        Optional[str],
        typer.Option(
            envvar=_env("server"), help="Judge through the service at this URL (see serve)."
        ),
    ] = None,
    token: Annotated[
        Optional[str], typer.Option(envvar=_env("token"), help="The service's API token.")
    ] = None,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            envvar=_env("local"),
            help="Judge in this process, even when a local service (kerneljudge serve) runs.",
        ),
    ] = False,
) -> None:
    """Judge CANDIDATE against --problem: build, correctness trials, timing, verdict. Without
    --server, a loopback `kerneljudge serve` found running judges it (one line says so);
    --local judges in this process."""
    import dataclasses

    from kerneljudge.candidate import Candidate
    from kerneljudge.judge import Judge
    from kerneljudge.problem import Problem
    from kerneljudge.verdict.render import render_verdict

    try:
        # The options first: a bad value is said before any file is read.
        config = _config(
            device=device,
            trials=trials,
            tolerance=tolerance,
            atol=atol,
            rtol=rtol,
            timing=timing,
            baselines=_csv(baselines),
            graph_timing=graph_timing,
            shape_sets=_csv(shape_sets),
            build_timeout_s=build_timeout,
            run_timeout_s=run_timeout,
            seed=seed,
            memory_budget_mib=memory_budget,
            cache_dir=cache_dir,
            max_time_s=max_time,
        )
        cand = Candidate.from_file(candidate, backend=backend)
        if server and local:
            raise KernelJudgeError("--local and --server exclude each other")
        unsupported: dict[str, object] = {"--atol": atol, "--rtol": rtol, "--seed": seed}
        unsupported["--backend"] = backend
        unsupported |= {"--memory-budget": memory_budget or None, "--cache-dir": cache_dir}
        verdict = None
        if server:  # the same verdict, judged by a service (kerneljudge serve)
            from kerneljudge.service.cli import remote_eval

            verdict = remote_eval(server, token, problem, cand, config, shape_sets, unsupported)
        elif not local:  # a warm local service, when one runs and can judge this
            from kerneljudge.service.cli import local_service_eval

            def note(line: str) -> None:
                err_console.print(f"kerneljudge: {line}", highlight=False, markup=False)

            verdict = local_service_eval(
                problem, cand, config, shape_sets, unsupported, token, note
            )
        if verdict is None:
            sets = Problem.load(problem).shape_sets
            if shape_sets == "all" and sets:
                config = dataclasses.replace(config, shape_sets=tuple(sets))
            with Judge(problem, config) as judge, StageReporter(err_console) as progress:
                judge.progress = progress  # stage lines on stderr: live on a terminal
                verdict = judge.evaluate(cand)
    except KernelJudgeError as exc:
        _fail(_message(exc))
        return
    if json_out:
        print(verdict.to_json())
    elif (
        verdict.build
        and not verdict.build.ok
        and (not verdict.build.cache_key or verdict.reason.endswith("does not define ModelNew"))
    ):
        # Rejected before any build (syntax error), or a module without ModelNew when
        # imported: one line says it all.
        err_console.print(f"{verdict.status.value}: {cand.name}: {verdict.reason}", highlight=False)
    else:
        render_verdict(verdict, console)
    raise typer.Exit(0 if verdict.correct else 1)


@app.command("build")
def build_command(
    candidate: Annotated[Path, typer.Argument(help="The candidate file.")],
    backend: BackendOpt = None,
    device: DeviceOpt = DEFAULT_DEVICE,
    build_timeout: Annotated[
        float, typer.Option(envvar=_env("build_timeout"))
    ] = DEFAULT_BUILD_TIMEOUT_S,
    cache_dir: CacheOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compile CANDIDATE only (no GPU needed): the shaped compiler log, or success."""
    import dataclasses

    from kerneljudge.build import BuildCache, build
    from kerneljudge.candidate import Candidate
    from kerneljudge.device import build_arch

    try:
        cand = Candidate.from_file(candidate, backend=backend)
        arch = build_arch(device if device.startswith("cuda") else None)
        result = build(cand, cache=BuildCache(cache_dir), arch=arch, timeout_s=build_timeout)
    except KernelJudgeError as exc:
        _fail(str(exc))
        return
    if json_out:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    elif result.ok:
        console.print(
            f"[green]built[/] {cand.name} ({cand.backend}) in {result.duration_s:.1f} s"
            + (" (cached)" if result.cached else "")
        )
    else:
        console.print(result.log, highlight=False, markup=False)
    raise typer.Exit(0 if result.ok else 1)


@problems_app.callback()
def problems_list(ctx: typer.Context) -> None:
    """List the bundled problems (with no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from kerneljudge.problem import Problem, bundled_problem_names

    table = Table(title="bundled problems")
    for col in ("name", "dtype", "tags", "shape sets", "description"):
        table.add_column(col, overflow="fold")
    for name in bundled_problem_names():
        try:
            p = Problem.load(name)
        except KernelJudgeError as exc:
            table.add_row(name, "-", "-", "-", f"[red]{exc}[/]")
            continue
        desc = re.split(r"\.\s+(?=[A-Z])", p.description)[0].removesuffix(".")
        table.add_row(
            p.name,
            str(p.dtype).removeprefix("torch."),
            ", ".join(p.tags),
            ", ".join(p.shape_sets) or "-",
            desc,
        )
    print_table(console, table)


@problems_app.command("show")
def problems_show(name: Annotated[str, typer.Argument(help="Bundled name or path.")]) -> None:
    """Print a problem's metadata and reference source. Where stdout is not a terminal, stdout
    gets the source exactly as it is in the problem's file and the metadata goes to stderr."""
    from kerneljudge.problem import Problem

    try:
        p = Problem.load(name)
    except KernelJudgeError as exc:
        _fail(str(exc))
        return
    meta = console if console.is_terminal else err_console
    meta.print(f"[bold]{p.name}[/]  ({p.path})")
    if p.description:
        meta.print(p.description, highlight=False)
    atol, rtol = p.tolerance
    meta.print(
        f"dtype {p.dtype}, atol={atol:g} rtol={rtol:g}, shape sets: "
        f"{', '.join(p.shape_sets) or '-'}",
        highlight=False,
    )
    if console.is_terminal:
        console.print(Syntax(p.source, "python", line_numbers=False))
    else:
        sys.stdout.write(p.source)
        sys.stdout.flush()


@app.command("examples")
def examples_command(
    problem: Annotated[
        Optional[str], typer.Option("--problem", "-p", help="Only this problem.")
    ] = None,
    device: DeviceOpt = DEFAULT_DEVICE,
    cache_dir: CacheOpt = None,
    max_time: Annotated[float, typer.Option(help="Timing budget per candidate, seconds.")] = 2.0,
    baselines: Annotated[
        str, typer.Option(envvar=_env("baselines"), help="Comma list of eager, compile.")
    ] = "eager",
    json_out: JsonOpt = False,
) -> None:
    """Judge the bundled examples (CUDA ones only where a GPU is visible); exit 1 on a surprise."""
    from kerneljudge.cli.examples import run_examples

    try:
        rows = run_examples(
            problem=problem,
            device=device,
            cache_dir=cache_dir,
            max_time_s=max_time,
            baselines=_csv(baselines),
            console=None if json_out else console,
        )
    except KernelJudgeError as exc:
        _fail(_message(exc))
        return
    if json_out:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    raise typer.Exit(0 if all(r.as_expected for r in rows) else 1)


from kerneljudge.agent.cli import episode_command  # noqa: E402 - needs no openai to import

app.command("episode")(episode_command)

from kerneljudge.lint.cli import lint as _lint  # noqa: E402 - typer command, torch-only imports

problems_app.command("lint")(_lint)

from kerneljudge.suite.cli import report_command, results_app, suite_app  # noqa: E402

app.add_typer(suite_app, name="suite")
app.add_typer(results_app, name="results")
app.command("report")(report_command)

from kerneljudge.service.cli import serve_command  # noqa: E402 - imports no FastAPI

app.command("serve")(serve_command)


def main() -> None:
    """Entry point of the console script. Ctrl-C, SIGTERM and SIGHUP stop a command
    (:class:`~kerneljudge.stopping.StopSignals`: a :class:`KeyboardInterrupt`, its workers
    ended and its temporary folders removed), with exit status ``128 + signum`` (130, 143,
    129); a signal ignored when the command starts (``nohup``'s SIGHUP) stays ignored."""
    from kerneljudge.worker.sandbox import set_undumpable

    set_undumpable()  # this process holds the run seed and the reference outputs
    if not (console.is_terminal and err_console.is_terminal):
        # Help (stdout) and usage errors (stderr) as click's plain text, not rich's panels.
        app.rich_markup_mode = None
    stop = StopSignals(keep_ignored=STOP_SIGNALS)
    try:
        with stop:
            app()
    except KeyboardInterrupt as exc:
        err_console.print("interrupted")
        sys.exit(exit_status(exc))
    except SystemExit as exc:
        # typer turns every KeyboardInterrupt into exit status 130; a stop that an inner block
        # took, or that a finalizer swallowed (the command then went on), is the signal's too.
        if stop.requested is not None and exc.code in (0, None, 130):
            if exc.code != 130:  # (a command that exits 130 itself has said so)
                err_console.print("interrupted")
            sys.exit(128 + stop.requested)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
