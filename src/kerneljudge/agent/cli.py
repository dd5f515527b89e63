"""``kerneljudge episode``: run agent episodes against a model server, or replay a transcript.

Every option also reads an environment variable ``KERNELJUDGE_<OPTION>`` (the API key also
``OPENAI_API_KEY``). Importing this module needs no ``openai``; running against a server does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from kerneljudge.cli.output import make_console, print_table
from kerneljudge.errors import ConfigError, KernelJudgeError
from kerneljudge.judge.config import (
    DEFAULT_BASELINES,
    DEFAULT_DEVICE,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
)

__all__ = ["episode_command"]

_console = make_console()
_err = make_console(stderr=True)


def _env(name: str) -> str:
    return f"KERNELJUDGE_{name.upper()}"


def _opt(name: str, help: str, **kw: Any) -> Any:
    return typer.Option(envvar=_env(name), help=help, **kw)


def _fail(message: str, code: int = 2) -> None:
    _err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _table(summaries: list[Any], title: str) -> Table:
    table = Table(title=title)
    for col in (
        "problem",
        "episode",
        "status",
        "reward",
        "vs eager",
        "vs compile",
        "calls",
        "turns",
        "tokens",
        "stop",
    ):
        table.add_column(col, justify="right" if col in ("reward", "calls", "turns") else "left")

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for s in summaries:
        table.add_row(
            s.problem,
            s.episode_id[-8:],
            s.status,
            fmt(s.reward, ".3f"),
            fmt(s.speedup_eager, ".2f"),
            fmt(s.speedup_compile, ".2f"),
            str(s.tool_calls),
            str(s.turns),
            str(s.prompt_tokens + s.completion_tokens),
            s.stop_reason,
        )
    return table


def episode_command(
    problem: Annotated[
        Optional[str],
        typer.Option(
            "--problem",
            "-p",
            envvar=_env("problem"),
            help="Bundled problem name(s) or file(s), comma-separated.",
        ),
    ] = None,
    model: Annotated[Optional[str], _opt("model", "Model name on the server.")] = None,
    base_url: Annotated[
        Optional[str],
        _opt("base_url", "OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1."),
    ] = None,
    api_key: Annotated[
        str,
        typer.Option(
            envvar=[_env("api_key"), "OPENAI_API_KEY"],
            help="Bearer token ('EMPTY' for local).",
            show_default=False,
        ),
    ] = "EMPTY",
    episodes: Annotated[int, _opt("episodes", "Episodes per problem.")] = 1,
    concurrency: Annotated[
        Optional[int],
        _opt(
            "concurrency",
            "Episodes run at once (default 1; --resume: the run's).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[Path, _opt("out", "Folder for transcripts and summary.jsonl.")] = Path(
        "episodes"
    ),
    resume: Annotated[
        Optional[Path],
        typer.Option(
            "--resume",
            envvar=_env("resume"),
            help="Continue the interrupted run in this folder (its plan and configuration).",
        ),
    ] = None,
    judges: Annotated[
        int, _opt("judges", "Judges (worker sets) alive at once; 0: min(--concurrency, 2).")
    ] = 0,
    replay_file: Annotated[
        Optional[Path],
        typer.Option(
            "--replay",
            envvar=_env("replay"),
            help="Re-run this transcript's tool calls through the judge (no model).",
        ),
    ] = None,
    max_tool_calls: Annotated[int, _opt("max_tool_calls", "Tool-call budget.")] = 30,
    max_turns: Annotated[int, _opt("max_turns", "Model replies allowed.")] = 40,
    on_exhausted: Annotated[
        str, _opt("on_exhausted", "submit_last_passing, submit_last or fail.")
    ] = "submit_last_passing",
    device: Annotated[str, _opt("device", "auto, cpu, cuda or cuda:N.")] = DEFAULT_DEVICE,
    tolerance: Annotated[str, _opt("tolerance", "oracle or allclose.")] = DEFAULT_TOLERANCE,
    trials: Annotated[int, _opt("trials", "run_correctness trials.")] = DEFAULT_TRIALS,
    submit_trials: Annotated[
        int, _opt("submit_trials", "submit_kernel trials per shape set.")
    ] = 10,
    baselines: Annotated[str, _opt("baselines", "Comma list of eager, compile.")] = ",".join(
        DEFAULT_BASELINES
    ),
    graph_timing: Annotated[
        bool,
        typer.Option(
            "--graph/--no-graph",
            envvar=_env("graph"),
            help="On a GPU, also time CUDA-graph replays and show both speedups.",
        ),
    ] = True,
    benchmark_time: Annotated[float, _opt("benchmark_time", "run_benchmark timing, s.")] = 2.0,
    submit_time: Annotated[float, _opt("submit_time", "submit_kernel timing, s.")] = 4.0,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile/--no-profile", envvar=_env("profile"), help="Profile in run_benchmark."
        ),
    ] = True,
    prompt_dir: Annotated[
        Optional[Path],
        _opt("prompt_dir", "Folder of prompt templates replacing the bundled ones."),
    ] = None,
    cache_dir: Annotated[Optional[Path], _opt("cache_dir", "Build cache folder.")] = None,
    temperature: Annotated[Optional[float], _opt("temperature", "Sampling temperature.")] = None,
    max_tokens: Annotated[Optional[int], _opt("max_tokens", "Tokens per reply.")] = None,
    max_retries: Annotated[int, _opt("max_retries", "Retries of a failed request.")] = 5,
    backoff: Annotated[float, _opt("backoff", "First retry wait, s (doubles).")] = 2.0,
    request_timeout: Annotated[float, _opt("request_timeout", "One request's limit, s.")] = 600.0,
    reasoning_in_history: Annotated[
        bool,
        typer.Option(
            "--reasoning-in-history/--no-reasoning-in-history",
            envvar=_env("reasoning_in_history"),
            help="Send the model's reasoning back in later requests.",
        ),
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", envvar=_env("json"), help="Print summaries as JSON lines.")
    ] = False,
    server: Annotated[
        Optional[str],
        _opt("server", "Judge through the service at this URL (kerneljudge serve)."),
    ] = None,
    token: Annotated[Optional[str], _opt("token", "The judge service's API token.")] = None,
) -> None:
    """Run agent episodes on --problem with --model at --base-url, --resume a run, or --replay
    a transcript.

    Exit status: 0 when every episode ran; 1 when a harness error ended one (said on stderr);
    2 on bad input (an unknown problem, bad options) or an unreachable server (the episodes not
    run stay planned: --resume the folder later); 130 on Ctrl-C (SIGINT), 143 on SIGTERM and
    129 on SIGHUP, which stop the run at once: the episodes in flight are marked interrupted,
    and --resume runs them again. With --server every episode is judged by
    that service (problems named as it knows them); no judge runs here.
    """
    from kerneljudge.agent.config import check_runner_numbers
    from kerneljudge.agent.interrupt import RunInterrupted
    from kerneljudge.env import EnvConfig
    from kerneljudge.env.prompts import check_prompt_dir
    from kerneljudge.judge.config import check_integer

    try:
        check_integer("episodes", episodes, 1)
        if concurrency is not None:
            check_integer("concurrency", concurrency, 1)
        check_integer("judges", judges, 0)
        check_runner_numbers(
            {
                "temperature": temperature,
                "max_tokens": max_tokens,
                "request_timeout_s": request_timeout,
                "max_retries": max_retries,
                "backoff_s": backoff,
            }
        )
        config = EnvConfig(
            max_tool_calls=max_tool_calls,
            max_turns=max_turns,
            on_exhausted=on_exhausted,
            device=device,
            tolerance=tolerance,
            trials=trials,
            submit_trials=submit_trials,
            baselines=tuple(b.strip() for b in baselines.split(",") if b.strip()),
            graph_timing=graph_timing,
            benchmark_time_s=benchmark_time,
            submit_time_s=submit_time,
            profile=profile,
            cache_dir=str(cache_dir) if cache_dir else None,
            prompt_dir=str(prompt_dir) if prompt_dir else None,
        )
        check_prompt_dir(prompt_dir)
    except ConfigError as exc:
        _fail(exc.for_option())
        return
    except (ValueError, OSError) as exc:
        _fail(str(exc))
        return
    progress = None if json_out else (lambda line: _err.print(line, highlight=False, markup=False))
    try:
        if replay_file is not None and server:
            raise ValueError("--server is not available with --replay")
        if replay_file is not None:
            summaries = [_replay(replay_file, problem, config, out, progress)]
            title = f"replay of {replay_file}"
        elif resume is not None:
            out = resume
            summaries, title = _resume(
                resume,
                model,
                base_url,
                api_key,
                concurrency,
                judges,
                max_retries,
                backoff,
                request_timeout,
                progress,
                (server, token),
            )
        else:
            summaries = _run(
                problem,
                model,
                base_url,
                api_key,
                config,
                out,
                episodes,
                concurrency or 1,
                temperature,
                max_tokens,
                max_retries,
                backoff,
                request_timeout,
                reasoning_in_history,
                progress,
                judges,
                (server, token),
            )
            title = f"{model} at {base_url}"
    except RunInterrupted as exc:  # a stop signal: the run's clean-up is done
        where = exc.out if exc.out is not None else (resume or out)
        _err.print(
            f"interrupted: continue with kerneljudge episode --resume {where}",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(exc.exit_status) from None
    except ConfigError as exc:  # a resumed run's recorded settings, or a library check
        _fail(exc.for_option())
        return
    except (KernelJudgeError, ImportError, ValueError, FileNotFoundError, RuntimeError) as exc:
        _fail(_with_resume_hint(exc, resume or out))
        return
    if json_out:
        for s in summaries:
            print(json.dumps(s.to_dict()))
    else:
        print_table(_console, _table(summaries, title))
        _console.print(f"transcripts in {out}/", highlight=False)
    failed = [s for s in summaries if s.stop_reason == "error"]
    for s in failed:  # a harness error ended the episode: say why, not only in summary.jsonl
        _err.print(f"error: episode {s.episode_id}: {s.error}", highlight=False, markup=False)
    if failed:
        raise typer.Exit(1)


def _replay(path: Path, problem: str | None, config: Any, out: Path, progress: Any) -> Any:
    """Replay with the transcript's configuration; options set to a non-default value win."""
    from kerneljudge.agent.replay import replay
    from kerneljudge.env import EnvConfig

    defaults = EnvConfig().to_dict()
    overrides = {k: v for k, v in config.to_dict().items() if v != defaults[k]}
    return replay(
        path, out_dir=out, problem=problem, overrides=_tuples(overrides), progress=progress
    )


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def _run(
    problem: str | None,
    model: str | None,
    base_url: str | None,
    api_key: str,
    config: Any,
    out: Path,
    episodes: int,
    concurrency: int,
    temperature: float | None,
    max_tokens: int | None,
    max_retries: int,
    backoff: float,
    request_timeout: float,
    reasoning_in_history: bool,
    progress: Any,
    judges: int,
    remote: tuple[str | None, str | None],
) -> list[Any]:
    from kerneljudge.agent.config import RunnerConfig
    from kerneljudge.agent.runs import run_episodes

    if not problem:
        raise ValueError("--problem is needed (or --replay FILE)")
    runner = RunnerConfig(
        model=model or "",
        base_url=base_url or "",
        api_key=api_key,
        temperature=temperature,
        max_tokens=max_tokens,
        max_retries=max_retries,
        backoff_s=backoff,
        request_timeout_s=request_timeout,
        reasoning_in_history=reasoning_in_history,
    )
    problems = [p.strip() for p in problem.split(",") if p.strip()]
    if not problems:
        raise ValueError(f"--problem {problem!r} names no problem")
    return run_episodes(
        problems,
        runner,
        config,
        episodes=episodes,
        concurrency=concurrency,
        out_dir=out,
        progress=progress,
        judges=judges,
        server=remote[0],
        token=remote[1],
    )


def _with_resume_hint(exc: BaseException, out: Path) -> str:
    """The error's line; for an unreachable server with episodes of the run left to run, how
    to continue the run later."""
    from kerneljudge.agent.runlog import PLAN, RunLog

    text = str(exc)
    if type(exc).__name__ == "ServerUnreachable" and (out / PLAN).exists():
        left = [st for st in RunLog(out, create=False).states() if st.summary is None]
        if left:
            text += f" (episodes not run stay planned: kerneljudge episode --resume {out})"
    return text


def _resume(
    out: Path,
    model: str | None,
    base_url: str | None,
    api_key: str,
    concurrency: int | None,
    judges: int,
    max_retries: int,
    backoff: float,
    request_timeout: float,
    progress: Any,
    remote: tuple[str | None, str | None],
) -> tuple[list[Any], str]:
    """Resume with the run's recorded runner settings and concurrency; --model, --base-url
    and --concurrency given win, and so do the retry options set to a non-default value."""
    import dataclasses

    from kerneljudge.agent.config import RunnerConfig
    from kerneljudge.agent.runlog import RunLog
    from kerneljudge.agent.runs import resume_episodes

    recorded = dict(RunLog(out, create=False).plan().get("runner") or {})
    fields = {f.name for f in dataclasses.fields(RunnerConfig)}
    settings = {k: v for k, v in recorded.items() if k in fields}
    changes = {"model": model, "base_url": base_url}
    settings.update({k: v for k, v in changes.items() if v})
    defaults = RunnerConfig(model="m", base_url="u")
    given = {"max_retries": max_retries, "backoff_s": backoff, "request_timeout_s": request_timeout}
    settings.update({k: v for k, v in given.items() if v != getattr(defaults, k)})
    runner = RunnerConfig(**{**settings, "api_key": api_key})
    summaries = resume_episodes(
        out,
        runner,
        concurrency=concurrency,
        progress=progress,
        judges=judges,
        server=remote[0],
        token=remote[1],
    )
    return summaries, f"{runner.model} at {runner.base_url} (resumed {out})"
