"""Replay: re-run a transcript's tool calls through the judge, without a model.

The calls are taken from the transcript's ``assistant`` records (or its ``tool`` records when
it has none), grouped by reply, and stepped through a fresh environment configured as the
transcript's header says (with overrides, e.g. another device or build cache). The replay writes
a transcript of its own, whose header names the one replayed (``replay_of``). It needs neither
the ``openai`` package nor a server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kerneljudge.agent.runner import summarize
from kerneljudge.agent.transcript import (
    EpisodeSummary,
    TranscriptWriter,
    read_transcript,
    recorded_turns,
)
from kerneljudge.env import EnvConfig, KernelEnv
from kerneljudge.env.rewards import RewardFn
from kerneljudge.judge import Judge

__all__ = ["replay"]


def replay(
    transcript: Path | str,
    *,
    out_dir: Path | str,
    problem: str | None = None,
    overrides: dict[str, Any] | None = None,
    judge: Judge | None = None,
    reward: RewardFn | None = None,
    progress: Callable[[str], None] | None = None,
) -> EpisodeSummary:
    """Re-run the tool calls of ``transcript`` and score the result.

    Args:
        transcript: a transcript file (see :mod:`kerneljudge.agent.transcript`).
        out_dir: where the replay's transcript goes (``<problem>/<id>.jsonl``; the
            summary is also appended to ``summary.jsonl`` there).
        problem: the problem to use instead of the one recorded.
        overrides: :class:`EnvConfig` fields to change (e.g. ``{"device": "cuda"}``).
        judge: a judge to use (None: the replay's own).
        reward: the reward function (None: the default).
        progress: called with one line per tool call.

    Returns:
        The replay's summary.

    Raises:
        FileNotFoundError, ValueError: the transcript is missing or malformed.
        ProblemError, WorkerError: harness failures.
    """
    records = read_transcript(transcript)
    head = records[0]
    config = EnvConfig.from_dict(dict(head.get("env_config") or {}))
    if overrides:
        config = config.replace(**overrides)
    spec = problem or str(head.get("problem") or "")
    if not spec:
        raise ValueError(f"{transcript}: the header names no problem; pass one")
    turns = recorded_turns(records)
    contents = [r.get("content", "") for r in records if r.get("type") == "assistant"]
    model = str(head.get("model") or "")
    say = progress or (lambda line: None)
    started = time.monotonic()
    with KernelEnv(spec, config, judge=judge, reward=reward) as env:
        task = env.reset()
        path = Path(out_dir) / env.problem.name / f"{env.state.episode_id}.jsonl"
        with TranscriptWriter(path) as tw:
            tw.header(
                episode_id=env.state.episode_id,
                problem=spec,
                model=model,
                base_url="",
                runner={},
                env_config=config.to_dict(),
                tools=task.tools,
                replay_of=str(transcript),
            )
            for m in task.messages:
                tw.message(m["role"], m["content"])
            for i, calls in enumerate(turns):
                if env.done:
                    break
                env.begin_turn()
                turn = env.state.turns_used
                tw.write(
                    {
                        "type": "assistant",
                        "turn": turn,
                        "content": contents[i] if i < len(contents) else "",
                        "reasoning": None,
                        "tool_calls": [
                            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                        ],
                        "finish_reason": "replay",
                        "usage": None,
                        "latency_s": None,
                        "attempts": 0,
                    }
                )
                for call in calls:
                    if env.done:
                        tw.skipped(turn, call)
                        continue
                    result = env.step(call)
                    tw.tool(turn, call, result)
                    say(
                        f"[replay {env.problem.name}] turn {turn} {call.name}: "
                        f"{(result.observation.splitlines() or [''])[0]}"
                    )
                if not env.done:
                    final = env.end_turn()
                    if final is not None:
                        tw.end(final)
            stop = ""
            if not env.done:
                final = env.finish("transcript_ended")
                tw.end(final)
                stop = "transcript_ended"
            summary = summarize(env, model, started, {}, stop_reason=stop, transcript=path)
            tw.summary(summary)
    out = Path(out_dir)
    with open(out / "summary.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(summary.to_dict()) + "\n")
    return summary
