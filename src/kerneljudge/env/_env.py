"""The environment: one problem, four tools, a budget, a reward.

An episode in ten lines::

    from kerneljudge.env import KernelEnv, ToolCall

    with KernelEnv("causal_gqa") as env:
        task = env.reset()                      # task.messages, task.tools (OpenAI schemas)
        result = env.step(ToolCall("run_correctness", {"kernel_code": code}))
        print(result.observation)
        result = env.step(ToolCall("submit_kernel", {"kernel_code": code}))
        print(result.done, result.reward, result.info.verdict.status)

A model-driven loop calls :meth:`KernelEnv.begin_turn` before handling each model reply and
:meth:`KernelEnv.end_turn` after it, so that the turn budget counts too.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneljudge.candidate import Candidate
from kerneljudge.env import observations as obs
from kerneljudge.env import prompts
from kerneljudge.env._context import JudgeSession, ToolContext
from kerneljudge.env._tool import Tool, ToolError
from kerneljudge.env.budget import Budget
from kerneljudge.env.config import EnvConfig
from kerneljudge.env.observations import Observation
from kerneljudge.env.remote import RemoteJudge, RemoteSession
from kerneljudge.env.rewards import RewardFn, default_reward
from kerneljudge.env.state import EpisodeState
from kerneljudge.env.tools import default_tools
from kerneljudge.errors import DeviceError, KernelJudgeError
from kerneljudge.judge import Judge
from kerneljudge.problem import Problem
from kerneljudge.verdict import BuildResult, Verdict

__all__ = ["EpisodeOver", "KernelEnv", "StepInfo", "StepResult", "Task", "ToolCall"]


class EpisodeOver(KernelJudgeError):
    """:meth:`KernelEnv.step` was called after the episode ended (a driver bug)."""

    def __init__(self, episode_id: str, stop_reason: str) -> None:
        self.episode_id = episode_id
        self.stop_reason = stop_reason
        super().__init__(f"episode {episode_id} is over ({stop_reason}); call reset() first")


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model made it.

    Attributes:
        name: the tool's name.
        arguments: the JSON text of the arguments (as servers send it) or a dict.
        id: the call's id (echoed in the tool message; "" when there is none).
    """

    name: str
    arguments: str | dict[str, Any] = "{}"
    id: str = ""

    @classmethod
    def parse(cls, obj: Any) -> ToolCall:
        """Accept a :class:`ToolCall`, an OpenAI ``tool_calls`` entry (dict or SDK object) or a
        ``{"name", "arguments"}`` dict.

        Raises:
            TypeError: none of these shapes.
        """
        if isinstance(obj, ToolCall):
            return obj
        if isinstance(obj, dict):
            fn = obj.get("function", obj)
            if isinstance(fn, dict) and "name" in fn:
                return cls(str(fn["name"]), fn.get("arguments") or "{}", str(obj.get("id") or ""))
        fn = getattr(obj, "function", None)
        if fn is not None and hasattr(fn, "name"):
            return cls(str(fn.name), fn.arguments or "{}", str(getattr(obj, "id", "") or ""))
        raise TypeError(f"not a tool call: {obj!r}")


@dataclass(frozen=True)
class Task:
    """What :meth:`KernelEnv.reset` returns.

    Attributes:
        system: the system message.
        prompt: the task prompt (the first user message).
        tools: the OpenAI function-calling schemas of the tools.
    """

    system: str
    prompt: str
    tools: list[dict[str, Any]]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The opening chat messages: system, then user."""
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.prompt},
        ]


@dataclass(frozen=True)
class StepInfo:
    """Structured details of one step.

    Attributes:
        tool: the tool's name ("" for the end of a turn).
        call_id: the tool call's id.
        outcome: see :class:`~kerneljudge.env.state.CallRecord` (``tool_error`` for an error).
        error: the tool error's message, "" otherwise.
        verdict: the tool's verdict (for ``submit_kernel`` and an automatic submission, the
            final one); None for compile_kernel and tool errors.
        build: compile_kernel's build result.
        profile: run_benchmark's profile rows (``name, device_time_ms, calls, share, own``).
        budget: the budget after the step.
        duration_s: wall time of the step (seconds).
        submitted_by: ``model`` or ``budget`` when the episode ended with an evaluation.
        stop_reason: why the episode ended ("" while it runs).
        result: the tool's own :class:`~kerneljudge.env.observations.Observation` (its text
            without the budget line; None for a step that ended the episode outside a tool
            call); not part of :meth:`to_dict`.
    """

    tool: str
    call_id: str
    outcome: str
    budget: Budget
    error: str = ""
    verdict: Verdict | None = None
    build: BuildResult | None = None
    profile: list[dict[str, Any]] | None = None
    duration_s: float = 0.0
    submitted_by: str = ""
    stop_reason: str = ""
    result: Observation | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the verdict and build as their own dicts)."""
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "result"
        }
        out["budget"] = dataclasses.asdict(self.budget)
        out["verdict"] = self.verdict.to_dict() if self.verdict else None
        out["build"] = dataclasses.asdict(self.build) if self.build else None
        return out


@dataclass(frozen=True)
class StepResult:
    """What :meth:`KernelEnv.step` returns.

    Attributes:
        observation: the text for the model (ends with the budget line).
        done: the episode has ended.
        reward: the final reward once done, else None.
        info: structured details, the verdict among them.
    """

    observation: str
    done: bool
    reward: float | None
    info: StepInfo


class KernelEnv:
    """The agent environment for one problem.

    Args:
        problem: a :class:`Problem`, a bundled problem name, or a path.
        config: the environment's configuration (default :class:`EnvConfig`).
        judge: a judge to run candidates on (kept open on :meth:`close`); None: the
            environment starts and ends its own. A judge is not thread-safe: give each
            concurrent environment its own. A :class:`~kerneljudge.env.remote.RemoteJudge`
            judges through a judge service.
        server, token, server_problem: judge through the service at ``server``
            (``http://host:port``) with this API token, naming the problem ``server_problem``
            (None: as given): the environment's own RemoteJudge (not with ``judge``).
        reward: the reward function (default :data:`~kerneljudge.env.rewards.default_reward`).
        device_lock: a lock shared with other environments on the same device, held while a
            candidate runs (builds run outside it).
        episode_id: the id of the first episode (None: a random one).

    Raises:
        ProblemError: the problem cannot be loaded.
        ValueError: an invalid configuration; ``server`` and ``judge`` both given.
        KernelJudgeError: ``server`` without the service's client installed.
    """

    def __init__(
        self,
        problem: Problem | str | Path,
        config: EnvConfig | None = None,
        *,
        judge: Judge | RemoteJudge | None = None,
        reward: RewardFn | None = None,
        device_lock: Any = None,
        episode_id: str | None = None,
        server: str | None = None,
        token: str | None = None,
        server_problem: str | None = None,
    ) -> None:
        self.config = config or EnvConfig()
        self._problem_spec = problem.name if isinstance(problem, Problem) else str(problem)
        if server is not None and judge is not None:
            raise ValueError("give a judge or a server, not both")
        self.session: JudgeSession | RemoteSession
        if server is not None:  # its own remote judge, closed with the environment
            remote = RemoteJudge(problem, server, token, server_problem=server_problem)
            self.session = RemoteSession(self.config, remote, owns_judge=True)
        elif isinstance(judge, RemoteJudge):
            self.session = RemoteSession(self.config, judge)
        else:
            loaded = (
                judge.problem
                if judge is not None
                else (problem if isinstance(problem, Problem) else Problem.load(problem))
            )
            self.session = JudgeSession(loaded, self.config, judge, device_lock)
        self.reward_fn: RewardFn = reward or default_reward
        self._ctx = ToolContext(self.session, self._reward)
        self.tools: list[Tool[Observation]] = default_tools(self._ctx)
        self._by_name = {t.name: t for t in self.tools}
        self.state = EpisodeState(episode_id or _new_id(), self._problem_spec, self.config)
        self._final: Verdict | None = None

    @classmethod
    def from_state(
        cls,
        state: EpisodeState | dict[str, Any] | str,
        *,
        judge: Judge | RemoteJudge | None = None,
        reward: RewardFn | None = None,
        device_lock: Any = None,
        **remote: Any,
    ) -> KernelEnv:
        """Continue an episode from its serialized state (e.g. in another process).

        Args:
            state: an :class:`EpisodeState`, its dict or its JSON text.
            remote: ``server``, ``token``, ``server_problem``, as :class:`KernelEnv` takes them.

        Raises:
            ProblemError: the state's problem cannot be loaded here.
            ValueError: the state is from a newer version.
        """
        if isinstance(state, str):
            state = EpisodeState.from_json(state)
        elif isinstance(state, dict):
            state = EpisodeState.from_dict(state)
        env = cls(
            state.problem,
            state.config,
            judge=judge,
            reward=reward,
            device_lock=device_lock,
            episode_id=state.episode_id,
            **remote,
        )
        env.state = state
        return env

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> KernelEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the judge's workers (when the environment started the judge)."""
        self.session.close()

    @property
    def problem(self) -> Problem:
        return self.session.problem

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def budget(self) -> Budget:
        return self.state.budget

    @property
    def final_verdict(self) -> Verdict | None:
        """The verdict the episode ended with (None while running, or when none)."""
        if self._final is None and self.state.verdict is not None:
            self._final = Verdict.from_dict(self.state.verdict)
        return self._final

    def reset(self, episode_id: str | None = None) -> Task:
        """Start a new episode (fresh budget and history); returns the task.

        Raises:
            ValueError, FileNotFoundError: a replaced prompt template is broken.
        """
        self.state = EpisodeState(episode_id or _new_id(), self._problem_spec, self.config)
        self._final = None
        return self.task()

    def task(self) -> Task:
        """The task of the current episode: system message, task prompt, tool schemas."""
        values = prompts.task_variables(
            self.problem, self.session.device_info(), self.config, self.tools
        )
        pdir = self.config.prompt_dir
        return Task(
            system=prompts.render("system.md", pdir, **values),
            prompt=prompts.render("task.md", pdir, **values),
            tools=[t.schema() for t in self.tools],
        )

    # ------------------------------------------------------------------ stepping
    def begin_turn(self) -> None:
        """Count one model reply (call before handling its tool calls)."""
        self.state.turns_used += 1

    def end_turn(self) -> StepResult | None:
        """Close a model reply. When that was the last reply allowed and nothing was
        submitted, apply the exhaustion policy and return the final step; else None."""
        if self.state.done or self.state.budget.turns_left > 0:
            return None
        t0 = time.monotonic()
        text = self._exhaust("replies", "turns_exhausted")
        return self._final_result("", "", text, t0)

    def finish(self, stop_reason: str = "stopped") -> StepResult:
        """End the episode now, applying the exhaustion policy (e.g. the model server failed).

        Raises:
            EpisodeOver: the episode has already ended.
        """
        if self.state.done:
            raise EpisodeOver(self.state.episode_id, self.state.stop_reason)
        t0 = time.monotonic()
        text = self._exhaust("replies", stop_reason, stopped=True)
        return self._final_result("", "", text, t0)

    def nudge(self) -> str:
        """The reminder for a reply that called no tool (ends with the budget line)."""
        return prompts.render("no_tool_call.md", self.config.prompt_dir, budget=self._budget_text())

    def step(self, call: ToolCall | dict[str, Any] | Any) -> StepResult:
        """Run one tool call.

        A tool error (unknown tool, malformed, non-object, oversized or invalid-Unicode
        arguments, missing arguments, empty code, a GPU candidate on a CPU environment) is an
        observation, never an exception; so is any other exception the call raises that is
        no :class:`~kerneljudge.errors.KernelJudgeError` (its type and message are the
        observation). It still counts against the budget.

        Args:
            call: a :class:`ToolCall` or anything :meth:`ToolCall.parse` accepts.

        Raises:
            EpisodeOver: the episode has ended.
            ProblemError: the problem's reference fails on its own (before the candidate ran).
            WorkerError: another harness failure.
        """
        if self.state.done:
            raise EpisodeOver(self.state.episode_id, self.state.stop_reason)
        try:
            call = ToolCall.parse(call)
        except TypeError:
            call = ToolCall(str(getattr(call, "name", "")), "{}", "")
        t0 = time.monotonic()
        self.state.calls_used += 1
        tool = self._by_name.get(call.name)
        try:
            if tool is None:
                names = ", ".join(self._by_name)
                shown = call.name if len(call.name) <= 80 else call.name[:77] + "..."
                what = f"there is no tool {shown!r}" if call.name else "the call names no tool"
                raise ToolError("", f"{what}; the tools are {names}")
            result = tool(call.arguments)
        except ToolError as exc:
            result = Observation.tool_error(call.name, exc.message, tool is not None, exc.code)
        except KernelJudgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - what the call's input made fail is its error
            message = f"this call could not be handled ({type(exc).__name__}: {exc})"
            result = Observation.tool_error(call.name, message[:2000], tool is not None, None)
        if result.submitted:
            self._end(result.verdict, result.reward, "model", "submitted")
        self.state.record(result, time.monotonic() - t0)
        text = result.text
        if not self.state.done and self.state.budget.calls_left == 0:
            text += "\n\n" + self._exhaust("tool calls", "tool_calls_exhausted")
        text += "\n\n" + self._budget_text()
        verdict = self._final if self.state.submitted_by == "budget" else result.verdict
        info = StepInfo(
            tool=call.name,
            call_id=call.id,
            outcome=result.outcome,
            budget=self.state.budget,
            error=result.error,
            verdict=verdict,
            build=result.build,
            profile=list(result.profile) if result.profile is not None else None,
            duration_s=time.monotonic() - t0,
            submitted_by=self.state.submitted_by,
            stop_reason=self.state.stop_reason,
            result=result,
        )
        return StepResult(text, self.state.done, self.state.reward, info)

    # ------------------------------------------------------------------ internals
    def _budget_text(self) -> str:
        budget = self.state.budget
        notes = []
        if not self.state.done:
            policy = prompts.exhausted_policy_text(self.config)
            if budget.calls_left == 1:
                notes.append(
                    prompts.render("last_call.md", self.config.prompt_dir, exhausted_policy=policy)
                )
            elif budget.turns_left == 1:
                notes.append(
                    prompts.render("last_turn.md", self.config.prompt_dir, exhausted_policy=policy)
                )
        return "\n".join([*notes, budget.line()])

    def _reward(self, verdict: Verdict | None) -> float:
        """The reward function of a final verdict (None: nothing was evaluated)."""
        return float(self.reward_fn(verdict))

    def _end(
        self, verdict: Verdict | None, reward: float | None, submitted_by: str, stop_reason: str
    ) -> float:
        """End the episode with ``verdict``; ``reward`` None: the reward function's."""
        reward = self._reward(verdict) if reward is None else reward
        self._final = verdict
        self.state.done = True
        self.state.reward = reward
        self.state.verdict = verdict.to_dict() if verdict is not None else None
        self.state.submitted_by = submitted_by if verdict is not None else ""
        self.state.stop_reason = stop_reason
        return reward

    def _exhaust(self, limit: str, stop_reason: str, stopped: bool = False) -> str:
        """Apply the exhaustion policy; returns the text that says what it did."""
        policy = self.config.on_exhausted
        code = None
        if policy == "submit_last_passing":
            code = self.state.last_passing_code
        elif policy == "submit_last":
            code = self.state.last_code
        verdict = None
        if code is not None:
            try:
                verdict = self.session.submit(Candidate.from_source(code, name="kernel_code"))
            except DeviceError:  # the last code needs a device this environment lacks
                verdict = None
        reward = self._end(verdict, None, "budget", stop_reason)
        if verdict is not None:
            which = "passed run_correctness" if policy == "submit_last_passing" else "you wrote"
            action = f"the last kernel that {which} was submitted for you.\n" + obs.submit_text(
                "submit_kernel", verdict, reward
            )
        elif policy == "fail":
            action = f"the episode counts as failed. Final reward: {reward:.3g}."
        else:
            what = "passed run_correctness" if policy == "submit_last_passing" else "was given"
            action = (
                f"no kernel {what}, so the episode counts as failed. Final reward: {reward:.3g}."
            )
        if stopped:
            return f"The episode was stopped before a submission: {action}"
        return prompts.render("exhausted.md", self.config.prompt_dir, limit=limit, action=action)

    def _final_result(self, tool: str, call_id: str, text: str, t0: float) -> StepResult:
        info = StepInfo(
            tool=tool,
            call_id=call_id,
            outcome="exhausted",
            budget=self.state.budget,
            verdict=self.final_verdict,
            duration_s=time.monotonic() - t0,
            submitted_by=self.state.submitted_by,
            stop_reason=self.state.stop_reason,
        )
        return StepResult(text + "\n\n" + self._budget_text(), True, self.state.reward, info)


def _new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]
