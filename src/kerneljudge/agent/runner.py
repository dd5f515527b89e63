"""The episode runner: a model on an OpenAI-compatible server, driving the environment.

One episode: the task prompt goes to the model; every tool call in its reply (several in one
reply run in order) is stepped through :class:`~kerneljudge.env.KernelEnv` and its observation
goes back as a ``tool`` message; a reply without a tool call gets a reminder; the episode ends on
``submit_kernel``, or when the budget runs out (the exhaustion policy decides), or when the
server refuses a request (the same policy; ``stop_reason`` ``model_error``). A server that
cannot be reached stops the episode without a score and raises :class:`ServerUnreachable`.

Runs of many episodes (planned, recorded, resumable, concurrent) are
:mod:`kerneljudge.agent.runs`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from kerneljudge.agent.config import RunnerConfig
from kerneljudge.agent.transcript import EpisodeSummary, TranscriptWriter
from kerneljudge.env import EnvConfig, KernelEnv, StepResult
from kerneljudge.env.rewards import RewardFn
from kerneljudge.judge import Judge

__all__ = ["ChatClient", "EventHook", "JudgeLease", "run_episode", "summarize"]

#: ``progress(line)``: one line per event, for a terminal.
Progress = Callable[[str], None]
#: ``lease()``: a context manager lending a judge of the episode's problem for its block.
JudgeLease = Callable[[], AbstractContextManager[Judge]]
#: ``on_event(event, fields)``: ``started`` (``episode_id``, ``transcript``) once the
#: transcript exists, ``step`` (``steps``: tool calls so far) after every tool call.
EventHook = Callable[[str, dict[str, Any]], None]


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


def _borrow(env: KernelEnv, lease: JudgeLease | None) -> Callable[[], Any]:
    """``using()``: a block during which ``env`` runs on a judge borrowed from ``lease`` (with
    the environment's device lock); a no-op without a lease."""
    if lease is None:
        return contextlib.nullcontext

    @contextlib.contextmanager
    def using() -> Iterator[None]:
        with lease() as judge:
            judge.device_lock = env.session.lock
            env.session.judge = judge
            yield

    return using


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
    lease: JudgeLease | None = None,
    device_lock: Any = None,
    reward: RewardFn | None = None,
    progress: Progress | None = None,
    on_event: EventHook | None = None,
    on_transcript: Callable[[TranscriptWriter], None] | None = None,
) -> EpisodeSummary:
    """Run one episode and write its transcript to ``out_dir/<problem>/<episode id>.jsonl``.

    Args:
        problem: a bundled problem name or a problem file.
        runner: the model server and sampling settings.
        env_config: the environment's configuration (default :class:`EnvConfig`).
        out_dir: where transcripts go.
        client: the model client (None: a :class:`~kerneljudge.agent.client.ModelClient`).
        judge: a judge to share (sequential use only); None: the episode's own.
        lease: where the episode borrows a judge for each step that needs one (creating the
            environment, each tool call, the end of a turn); between them it holds none, so
            that a few judges serve many episodes waiting for their model. Wins over
            ``judge``.
        device_lock: the lock shared by episodes on the same device.
        reward: the reward function (None: the default).
        progress: called with one line per event.
        on_event: called as the episode goes (see :data:`EventHook`).
        on_transcript: called with the episode's :class:`TranscriptWriter` once its header is
            written, before the ``started`` event (a run uses it to end the transcript of an
            episode it stops).

    Returns:
        The episode's summary (also the transcript's last line).

    Raises:
        ServerUnreachable: the server could not be reached; the transcript ends with a summary
            whose ``stop_reason`` is ``server_unreachable``. An exception raised once the
            transcript exists carries that summary as its ``summary`` attribute.
        MissingExtraError: ``client`` is None and the ``openai`` package is missing.
        ProblemError, WorkerError: harness failures (the transcript records them).

    Whatever the model sends (tool calls with malformed, non-object or invalid-Unicode
    arguments, unknown tools, replies the client could not read) ends as an observation for the
    model or as the episode's ``model_error`` end, never as an exception.
    """
    from kerneljudge.agent.client import ModelRequestError, ServerUnreachable

    if client is None:
        from kerneljudge.agent.client import ModelClient

        client = ModelClient(runner)
    say = progress or (lambda line: None)
    hook = on_event or (lambda event, fields: None)
    started = time.monotonic()
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    with lease() if lease is not None else contextlib.nullcontext(judge) as first:
        env = KernelEnv(problem, env_config, judge=first, reward=reward, device_lock=device_lock)
        task = env.reset()
    using = _borrow(env, lease)
    with env:
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
            if on_transcript is not None:
                on_transcript(tw)
            hook("started", {"episode_id": env.state.episode_id, "transcript": str(path)})
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
                        with using():
                            tw.end(env.finish("model_error"))
                        break
                    except ServerUnreachable:
                        raise
                    except Exception as exc:  # noqa: BLE001 - an unforeseen client failure
                        error = f"the reply could not be read: {type(exc).__name__}: {exc}"
                        stop_reason = "model_error"
                        say(f"{tag} turn {turn}: {error}")
                        with using():
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
                        with using():
                            result = env.step(call)
                        tw.tool(turn, call, result)
                        hook("step", {"steps": env.state.calls_used})
                        messages.append(
                            {
                                "role": "tool",
                                "tool_call_id": call.id,
                                "content": result.observation,
                            }
                        )
                        say(f"{tag} turn {turn} {call.name} {_short(result)}")
                    if not env.done:
                        with using():
                            final = env.end_turn()
                        if final is not None:
                            tw.end(final)
            except Exception as exc:
                unreachable = isinstance(exc, ServerUnreachable)
                summary = summarize(
                    env,
                    runner.model,
                    started,
                    usage,
                    stop_reason="server_unreachable" if unreachable else "error",
                    error=str(exc) or type(exc).__name__,
                    transcript=path,
                )
                tw.summary(summary)
                exc.summary = summary  # type: ignore[attr-defined]  # for the run's record
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
