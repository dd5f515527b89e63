"""Episode transcripts: one JSON object a line, written as the episode happens.

Record types (the ``type`` field), in the order they appear:

``episode``
    the header: ``episode_id``, ``problem``, ``model``, ``base_url``, ``runner`` (the runner's
    settings without the API key), ``env_config``, ``tools`` (the schemas), ``started_at``,
    ``versions``, ``transcript_version``; ``replay_of`` for a replay.
``message``
    a system or user message: ``role``, ``content`` (the task prompt, a reminder).
``assistant``
    one model reply: ``turn``, ``content``, ``reasoning`` (when the server sent it),
    ``tool_calls`` (``id``, ``name``, ``arguments`` as the raw JSON text), ``finish_reason``,
    ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``), ``latency_s``,
    ``attempts``.
``tool``
    one tool call and what came back: ``turn``, ``call_id``, ``name``, ``arguments``,
    ``observation``, ``outcome``, ``error``, ``done``, ``reward``, ``duration_s``, ``budget``,
    ``verdict`` (the full verdict dict or null), ``build``, ``profile``.
``skipped``
    a tool call of the last reply that came after the episode ended.
``end``
    the episode ended outside a tool call (turns exhausted, server error): ``observation``,
    ``reward``, ``stop_reason``, ``verdict``.
``summary``
    the last line: see :class:`EpisodeSummary`.

Every record also has ``t``: seconds since the episode started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kerneljudge.env import EnvConfig, StepResult, ToolCall
from kerneljudge.verdict import Verdict

__all__ = [
    "TRANSCRIPT_VERSION",
    "EpisodeSummary",
    "TranscriptWriter",
    "read_transcript",
    "recorded_turns",
    "write_transcript_from_calls",
]

#: Version of the transcript format; readers refuse a newer major version.
TRANSCRIPT_VERSION = "1.0"


@dataclass(frozen=True)
class EpisodeSummary:
    """The outcome of one episode (the transcript's last line, and ``summary.jsonl``).

    Attributes:
        episode_id, problem, model: which episode.
        status: the final verdict's status, or ``none`` when there was no final verdict.
        reward: the final reward (None when the episode did not end).
        speedup_eager, speedup_compile: the final verdict's median speedups (None without).
        submitted_by: ``model``, ``budget`` or "".
        stop_reason: ``submitted``, ``tool_calls_exhausted``, ``turns_exhausted``,
            ``model_error`` (the server refused a request), ``server_unreachable``, ``error``.
        tool_calls, turns: budget spent.
        prompt_tokens, completion_tokens: summed over the episode's replies.
        duration_s: wall time of the episode (seconds).
        error: the error that stopped the episode, "" when none.
        transcript: the transcript's path.
        verdict: the final verdict itself (None without one); not part of :meth:`to_dict`,
            whose ``status`` and speedups come from it.
    """

    episode_id: str
    problem: str
    model: str
    status: str
    reward: float | None
    speedup_eager: float | None
    speedup_compile: float | None
    submitted_by: str
    stop_reason: str
    tool_calls: int
    turns: int
    prompt_tokens: int
    completion_tokens: int
    duration_s: float
    error: str = ""
    transcript: str = ""
    verdict: Verdict | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeSummary:
        """A summary from :meth:`to_dict`'s fields (other keys are ignored; the verdict is the
        transcript's, not read here)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"verdict"}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The summary's JSON fields (all but :attr:`verdict`)."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "verdict"
        }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class TranscriptWriter:
    """Appends records to a JSONL file, each line flushed to disk (``fsync``) before the
    episode goes on: a crash or a kill loses nothing written but a torn last line.

    Another thread may end the transcript of an episode that is still running
    (:meth:`interrupt`, :meth:`discard`); the records written after that are dropped.

    Args:
        path: the transcript file (its folder is created).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._sealed = False

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def write(self, record: dict[str, Any]) -> None:
        """Write one record (``t`` is added); nothing once the transcript was ended by
        :meth:`interrupt` or :meth:`discard`."""
        record = {**record, "t": round(time.monotonic() - self._t0, 3)}
        with self._lock:
            if self._sealed:
                return
            self._file.write(json.dumps(record, default=str) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def interrupt(self, steps: int, reason: str) -> Path | None:
        """End the transcript of an episode stopped before its end: an ``interrupted`` record
        (``steps``, ``reason``) is its last line, and the file is renamed
        ``<episode id>.interrupted.jsonl``; later records are dropped.

        Returns:
            The new path; None when the writer was closed already (the episode had written
            its summary), which leaves the file as it is.
        """
        with self._lock:
            if self._sealed or self._file.closed:
                return None
            self._sealed = True
            record = {"type": "interrupted", "steps": steps, "reason": reason}
            record["t"] = round(time.monotonic() - self._t0, 3)
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            moved = self.path.with_name(self.path.stem + ".interrupted.jsonl")
            self.path.replace(moved)
            return moved

    def discard(self) -> None:
        """Remove the transcript (an episode that must not have begun); later records are
        dropped."""
        with self._lock:
            self._sealed = True
            self._file.close()
            self.path.unlink(missing_ok=True)

    def header(self, **fields: Any) -> None:
        from kerneljudge import __version__

        self.write(
            {
                "type": "episode",
                "transcript_version": TRANSCRIPT_VERSION,
                "started_at": _now(),
                "versions": {"kerneljudge": __version__},
                **fields,
            }
        )

    def message(self, role: str, content: str) -> None:
        self.write({"type": "message", "role": role, "content": content})

    def tool(self, turn: int, call: ToolCall, result: StepResult) -> None:
        """A tool call and its step result."""
        info = result.info.to_dict()
        self.write(
            {
                "type": "tool",
                "turn": turn,
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments),
                "observation": result.observation,
                "outcome": info["outcome"],
                "error": info["error"],
                "done": result.done,
                "reward": result.reward,
                "duration_s": info["duration_s"],
                "budget": info["budget"],
                "verdict": info["verdict"],
                "build": info["build"],
                "profile": info["profile"],
            }
        )

    def skipped(self, turn: int, call: ToolCall) -> None:
        self.write(
            {
                "type": "skipped",
                "turn": turn,
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "reason": "the episode had ended",
            }
        )

    def end(self, result: StepResult) -> None:
        """The end of an episode outside a tool call."""
        self.write(
            {
                "type": "end",
                "observation": result.observation,
                "reward": result.reward,
                "stop_reason": result.info.stop_reason,
                "submitted_by": result.info.submitted_by,
                "verdict": result.info.verdict.to_dict() if result.info.verdict else None,
            }
        )

    def summary(self, summary: EpisodeSummary) -> None:
        self.write({"type": "summary", **summary.to_dict()})


def read_transcript(path: Path | str) -> list[dict[str, Any]]:
    """The records of a transcript, in order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object, the first record is not the ``episode``
            header, or the transcript is from a newer major version.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: a record must be a JSON object")
            records.append(record)
    if not records or records[0].get("type") != "episode":
        raise ValueError(f"{path}: a transcript starts with an 'episode' record")
    version = str(records[0].get("transcript_version", TRANSCRIPT_VERSION))
    if int(version.split(".")[0]) > int(TRANSCRIPT_VERSION.split(".")[0]):
        raise ValueError(f"{path}: transcript version {version} is newer than {TRANSCRIPT_VERSION}")
    return records


def recorded_turns(records: list[dict[str, Any]]) -> list[list[ToolCall]]:
    """The tool calls of a transcript, grouped by model reply.

    The ``assistant`` records are the source (every call the model made, also those skipped
    after the end); a transcript without them (hand-written) is read from its ``tool``
    records, grouped by their ``turn``.
    """
    turns: list[list[ToolCall]] = []
    assistants = [r for r in records if r.get("type") == "assistant"]
    if assistants:
        for rec in assistants:
            turns.append(
                [
                    ToolCall(
                        str(c.get("name", "")), c.get("arguments") or "{}", str(c.get("id", ""))
                    )
                    for c in rec.get("tool_calls") or []
                ]
            )
        return turns
    by_turn: dict[int, list[ToolCall]] = {}
    for rec in records:
        if rec.get("type") == "tool":
            call = ToolCall(
                str(rec["name"]), rec.get("arguments") or "{}", str(rec.get("call_id", ""))
            )
            by_turn.setdefault(int(rec.get("turn", 0)), []).append(call)
    return [by_turn[k] for k in sorted(by_turn)]


def write_transcript_from_calls(
    path: Path | str,
    problem: str,
    turns: list[list[tuple[str, dict[str, Any]]]],
    *,
    env_config: EnvConfig | None = None,
    model: str = "",
    note: str = "",
    contents: list[str] | None = None,
) -> Path:
    """Write a replayable transcript of given tool calls (no model, no judge involved).

    Args:
        path: the file to write.
        problem: the problem's name or path.
        turns: the model replies, each a list of ``(tool name, arguments)``.
        env_config: the configuration recorded for the replay (default :class:`EnvConfig`).
        model: the model name to record ("" when unknown).
        note: a free-text note stored in the header.
        contents: each reply's text, when known.

    Returns:
        The path written.
    """
    config = env_config or EnvConfig()
    with TranscriptWriter(path) as tw:
        tw.header(
            episode_id=Path(path).stem,
            problem=problem,
            model=model,
            base_url="",
            runner={},
            env_config=config.to_dict(),
            tools=[],
            note=note,
        )
        for i, calls in enumerate(turns):
            tw.write(
                {
                    "type": "assistant",
                    "turn": i + 1,
                    "content": contents[i] if contents and i < len(contents) else "",
                    "reasoning": None,
                    "tool_calls": [
                        {"id": f"call_{i + 1}_{j + 1}", "name": name, "arguments": json.dumps(args)}
                        for j, (name, args) in enumerate(calls)
                    ],
                    "finish_reason": "tool_calls",
                    "usage": None,
                    "latency_s": None,
                    "attempts": 0,
                }
            )
    return Path(path)
