"""The episode runner: a model on an OpenAI-compatible server, driving the environment.

One episode: the task prompt goes to the model; every tool call in its reply (several in one
reply run in order) is stepped through :class:`~kerneljudge.env.KernelEnv` and its observation
goes back as a ``tool`` message; a reply without a tool call gets a reminder; the episode ends on
``submit_kernel``, or when the budget runs out (the exhaustion policy decides), or when the
server refuses a request (the same policy; ``stop_reason`` ``model_error``). A server that
cannot be reached stops the episode without a score and raises :class:`ServerUnreachable`.

Concurrency (:func:`run_episodes`): episodes run in threads, each with its own environment and
so its own :class:`~kerneljudge.judge.Judge` (a judge is not thread-safe) and its own worker
processes; the build cache is shared (builds of the same code wait for each other on a file
lock). Builds run in parallel; everything that runs a candidate on the device (correctness,
timing, profiling) holds one lock shared by all episodes, so timings never overlap.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from kerneljudge.agent.config import RunnerConfig
from kerneljudge.agent.transcript import EpisodeSummary, TranscriptWriter
from kerneljudge.env import EnvConfig, KernelEnv, StepResult
from kerneljudge.env.rewards import RewardFn
from kerneljudge.errors import KernelJudgeError
from kerneljudge.judge import Judge
from kerneljudge.problem import resolve_problem

__all__ = ["ChatClient", "run_episode", "run_episodes", "summarize"]

#: ``progress(line)``: one line per event, for a terminal.
Progress = Callable[[str], None]


class ChatClient(Protocol):
    """What the runner needs of a model client (:class:`~kerneljudge.agent.client.ModelClient`)."""

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any: ...


def summarize(
    env: KernelEnv,
    model: str,
    started: float,
    usage: dict[str, int],
    *,
    stop_reason: str = "",
    error: str = "",
    transcript: Path | str = "",
) -> EpisodeSummary:
    """The summary of an episode from its environment's state."""
    state = env.state
    verdict = env.final_verdict
    speed = {}
    if verdict is not None and verdict.timing is not None:
        speed = {s.baseline: s.median for s in verdict.timing.speedups}
    return EpisodeSummary(
        episode_id=state.episode_id,
        problem=env.problem.name,
        model=model,
        status=verdict.status.value if verdict is not None else "none",
        reward=state.reward,
        speedup_eager=speed.get("eager"),
        speedup_compile=speed.get("compile"),
        submitted_by=state.submitted_by,
        stop_reason=stop_reason or state.stop_reason,
        tool_calls=state.calls_used,
        turns=state.turns_used,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        duration_s=round(time.monotonic() - started, 3),
        error=error,
        transcript=str(transcript),
        verdict=verdict,
    )


def _short(result: StepResult) -> str:
    """The observation's first line, for a progress line (the tool's name already shown)."""
    first = result.observation.splitlines()[0] if result.observation else ""
    first = first.removeprefix(result.info.tool).lstrip(" :")
    return first if len(first) <= 100 else first[:97] + "..."


def run_episode(
    problem: str | Path,
    runner: RunnerConfig,
    env_config: EnvConfig | None = None,
    *,
    out_dir: Path | str,
    client: ChatClient | None = None,
    judge: Judge | None = None,
    device_lock: Any = None,
    reward: RewardFn | None = None,
    progress: Progress | None = None,
) -> EpisodeSummary:
    """Run one episode and write its transcript to ``out_dir/<problem>/<episode id>.jsonl``.

    Args:
        problem: a bundled problem name or a problem file.
        runner: the model server and sampling settings.
        env_config: the environment's configuration (default :class:`EnvConfig`).
        out_dir: where transcripts go.
        client: the model client (None: a :class:`~kerneljudge.agent.client.ModelClient`).
        judge: a judge to share (sequential use only); None: the episode's own.
        device_lock: the lock shared by episodes on the same device.
        reward: the reward function (None: the default).
        progress: called with one line per event.

    Returns:
        The episode's summary (also the transcript's last line).

    Raises:
        ServerUnreachable: the server could not be reached; the transcript ends with a summary
            whose ``stop_reason`` is ``server_unreachable``.
        MissingExtraError: ``client`` is None and the ``openai`` package is missing.
        ProblemError, WorkerError: harness failures (the transcript records them).
    """
    from kerneljudge.agent.client import ModelRequestError, ServerUnreachable

    if client is None:
        from kerneljudge.agent.client import ModelClient

        client = ModelClient(runner)
    say = progress or (lambda line: None)
    started = time.monotonic()
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    env = KernelEnv(problem, env_config, judge=judge, reward=reward, device_lock=device_lock)
    with env:
        task = env.reset()
        tag = f"[{env.problem.name} {env.state.episode_id[-8:]}]"
        path = Path(out_dir) / env.problem.name / f"{env.state.episode_id}.jsonl"
        with TranscriptWriter(path) as tw:
            tw.header(
                episode_id=env.state.episode_id,
                problem=str(problem),
                model=runner.model,
                base_url=runner.base_url,
                runner=runner.public_dict(),
                env_config=env.config.to_dict(),
                tools=task.tools,
            )
            messages = list(task.messages)
            for m in messages:
                tw.message(m["role"], m["content"])
            stop_reason, error = "", ""
            try:
                while not env.done:
                    env.begin_turn()
                    turn = env.state.turns_used
                    try:
                        reply = client.complete(messages, task.tools)
                    except ModelRequestError as exc:
                        error, stop_reason = str(exc), "model_error"
                        say(f"{tag} turn {turn}: {exc}")
                        tw.end(env.finish("model_error"))
                        break
                    for key in usage:
                        usage[key] += int(reply.usage.get(key, 0))
                    tw.write({"type": "assistant", "turn": turn, **reply.to_record()})
                    messages.append(reply.history_message(runner.reasoning_in_history))
                    if not reply.tool_calls:
                        nudge = env.nudge()
                        messages.append({"role": "user", "content": nudge})
                        tw.message("user", nudge)
                        say(f"{tag} turn {turn}: no tool call")
                    for call in reply.tool_calls:
                        if env.done:
                            tw.skipped(turn, call)
                            continue
                        result = env.step(call)
                        tw.tool(turn, call, result)
                        messages.append(
                            {
                                "role": "tool",
                                "tool_call_id": call.id,
                                "content": result.observation,
                            }
                        )
                        say(f"{tag} turn {turn} {call.name} {_short(result)}")
                    if not env.done:
                        final = env.end_turn()
                        if final is not None:
                            tw.end(final)
            except (ServerUnreachable, KernelJudgeError) as exc:
                unreachable = isinstance(exc, ServerUnreachable)
                summary = summarize(
                    env,
                    runner.model,
                    started,
                    usage,
                    stop_reason="server_unreachable" if unreachable else "error",
                    error=str(exc),
                    transcript=path,
                )
                tw.summary(summary)
                raise
            summary = summarize(
                env,
                runner.model,
                started,
                usage,
                stop_reason=stop_reason,
                error=error,
                transcript=path,
            )
            tw.summary(summary)
    say(f"{tag} done: {summary.status}, reward {summary.reward}")
    return summary


def run_episodes(
    problems: list[str],
    runner: RunnerConfig,
    env_config: EnvConfig | None = None,
    *,
    episodes: int = 1,
    concurrency: int = 1,
    out_dir: Path | str,
    client: ChatClient | None = None,
    reward: RewardFn | None = None,
    progress: Progress | None = None,
) -> list[EpisodeSummary]:
    """Run ``episodes`` episodes of every problem, ``concurrency`` at a time.

    Each episode gets its own environment and judge; one device lock is shared (see the module
    docstring). Summaries are appended to ``out_dir/summary.jsonl`` as episodes end.

    Returns:
        The summaries, in the order the episodes were scheduled (an episode that failed with
        a harness error has ``stop_reason`` ``error``).

    Raises:
        ProblemError: a problem names no bundled problem and no file (before any episode).
        ServerUnreachable: the server could not be reached; episodes not yet started are not
            run.
        MissingExtraError: ``client`` is None and the ``openai`` package is missing.
        ValueError: ``episodes`` or ``concurrency`` below 1.
    """
    from kerneljudge.agent.client import ServerUnreachable

    if episodes < 1 or concurrency < 1:
        raise ValueError("episodes and concurrency must be at least 1")
    for problem in problems:
        resolve_problem(problem)  # a misspelt name fails here, not in every episode
    if client is None:
        from kerneljudge.agent.client import ModelClient

        client = ModelClient(runner)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    write_lock = threading.Lock()
    stop = threading.Event()
    unreachable: list[ServerUnreachable] = []
    jobs = [(p, i) for p in problems for i in range(episodes)]

    def job(problem: str, index: int) -> EpisodeSummary | None:
        if stop.is_set():
            return None
        try:
            summary = run_episode(
                problem,
                runner,
                env_config,
                out_dir=out,
                client=client,
                device_lock=lock,
                reward=reward,
                progress=progress,
            )
        except ServerUnreachable as exc:
            stop.set()
            unreachable.append(exc)
            return None
        except KernelJudgeError as exc:
            summary = EpisodeSummary(
                episode_id=f"{problem}-{index}",
                problem=str(problem),
                model=runner.model,
                status="none",
                reward=None,
                speedup_eager=None,
                speedup_compile=None,
                submitted_by="",
                stop_reason="error",
                tool_calls=0,
                turns=0,
                prompt_tokens=0,
                completion_tokens=0,
                duration_s=0.0,
                error=str(exc),
            )
        with write_lock, open(out / "summary.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(summary.to_dict()) + "\n")
        return summary

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(job, p, i) for p, i in jobs]
        results = [f.result() for f in futures]
    if unreachable:
        raise unreachable[0]
    return [r for r in results if r is not None]
