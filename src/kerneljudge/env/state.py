"""Episode state: everything needed to continue an episode elsewhere, as plain JSON.

The judge's worker processes are not state: a :class:`KernelEnv` rebuilt from an
:class:`EpisodeState` in another process (:meth:`KernelEnv.from_state`) starts its own and goes
on from the same budget, history and best code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from kerneljudge.env.budget import Budget
from kerneljudge.env.config import EnvConfig
from kerneljudge.env.observations import Observation

__all__ = ["CallRecord", "EpisodeState", "STATE_VERSION"]

#: Version of the state's JSON form; readers refuse a newer major version.
STATE_VERSION = "1.0"


@dataclass(frozen=True)
class CallRecord:
    """One tool call as the environment saw it.

    Attributes:
        index: 1-based number of the call in the episode.
        turn: the model turn it came in (0 when driven without turns).
        tool: the tool's name as the model sent it.
        outcome: ``passed``/``failed`` (run_correctness), ``built`` (compile_kernel), a verdict
            status (``compile_error``, ``incorrect``, ..., ``correct``), or ``tool_error``.
        code_sha256: sha256 of the code given, "" when none.
        duration_s: wall time of the call (seconds).
    """

    index: int
    turn: int
    tool: str
    outcome: str
    code_sha256: str = ""
    duration_s: float = 0.0


@dataclass
class EpisodeState:
    """The serializable state of one episode.

    Attributes:
        episode_id: a unique id (also the transcript's).
        problem: the problem's name or path, as the environment was given it.
        config: the environment's configuration.
        calls_used, turns_used: budget spent.
        history: one record per tool call.
        last_code: the last code given to any tool.
        last_passing_code: the last code that passed run_correctness or run_benchmark.
        done: the episode has ended.
        reward: the final reward (None until done).
        verdict: the final verdict as a dict (:meth:`Verdict.to_dict`), None without one.
        submitted_by: ``model`` (submit_kernel), ``budget`` (the exhaustion policy), or "".
        stop_reason: ``submitted``, ``tool_calls_exhausted``, ``turns_exhausted``,
            ``stopped`` (ended by the driver), or "" while running.
    """

    episode_id: str
    problem: str
    config: EnvConfig
    calls_used: int = 0
    turns_used: int = 0
    history: list[CallRecord] = field(default_factory=list)
    last_code: str | None = None
    last_passing_code: str | None = None
    done: bool = False
    reward: float | None = None
    verdict: dict[str, Any] | None = None
    submitted_by: str = ""
    stop_reason: str = ""

    @property
    def budget(self) -> Budget:
        return Budget(
            self.config.max_tool_calls, self.config.max_turns, self.calls_used, self.turns_used
        )

    def record(self, result: Observation, duration_s: float) -> CallRecord:
        """Add a tool call's observation to the history (as call :attr:`calls_used`).

        Its code becomes :attr:`last_code`, and :attr:`last_passing_code` too when it passed.

        Args:
            result: the tool's observation.
            duration_s: wall time of the call (seconds).

        Returns:
            The record added.
        """
        if result.code is not None:
            self.last_code = result.code
            if result.passed:
                self.last_passing_code = result.code
        sha = hashlib.sha256(result.code.encode()).hexdigest() if result.code else ""
        record = CallRecord(
            index=self.calls_used,
            turn=self.turns_used,
            tool=result.tool,
            outcome=result.outcome,
            code_sha256=sha,
            duration_s=duration_s,
        )
        self.history.append(record)
        return record

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict carrying :data:`STATE_VERSION`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["config"] = self.config.to_dict()
        out["history"] = [dataclasses.asdict(r) for r in self.history]
        out["state_version"] = STATE_VERSION
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeState:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            ValueError: a newer major state version, or an invalid configuration.
        """
        version = str(data.get("state_version", STATE_VERSION))
        if int(version.split(".")[0]) > int(STATE_VERSION.split(".")[0]):
            raise ValueError(f"episode state {version} is newer than supported {STATE_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["config"] = EnvConfig.from_dict(dict(data["config"]))
        kwargs["history"] = [CallRecord(**r) for r in data.get("history", [])]
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> EpisodeState:
        return cls.from_dict(json.loads(text))
