"""kerneljudge as a ``verifiers`` environment (the ``verifiers.v1`` API, verifiers >= 0.4).

::

    from kerneljudge.integrations.verifiers import load_environment

    env = load_environment(problems="causal_gqa,triangle_attention", max_turns=20,
                           device="cuda", max_tool_calls=30)
    # or from the command line: vf-eval kerneljudge_verifiers ...

The pieces, in verifiers' terms:

- :class:`KernelTaskset` yields one :class:`KernelTask` per problem; the task's data carry the
  problem and the environment's configuration (:class:`~kerneljudge.env.EnvConfig` as JSON).
- :class:`KernelHarness` plays the episode: kerneljudge's own runner
  (:func:`kerneljudge.agent.run_episode`) talks to the model through the rollout's
  interception endpoint, with the four tools (``compile_kernel``, ``run_correctness``,
  ``run_benchmark``, ``submit_kernel``), the tool-call and turn budget, the reminders and the
  exhaustion policy of :class:`~kerneljudge.env.KernelEnv`. The tools run in the harness's
  process (the judge sandboxes every candidate itself), so the harness needs no MCP server
  and no container; the final verdict goes to ``trace.info["kerneljudge"]``.
- :meth:`KernelTask.kernel_reward` (the rubric) scores the trace: the reward of
  :class:`~kerneljudge.env.rewards.SpeedupReward` for that verdict (0 without one), with
  the knobs of :class:`KernelTaskConfig`. Metrics: ``correct`` (1 or 0), ``speedup_eager``.

The taskset and harness are exported by the top-level module ``kerneljudge_verifiers`` too
(verifiers resolves plugins by top-level package name). Importing this module without
``verifiers`` raises :class:`~kerneljudge.integrations._common.MissingExtraError`
(``install kerneljudge[verifiers]``).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterable
from typing import Any

from kerneljudge.integrations._common import MissingExtraError, env_config, problem_list

try:
    import verifiers.v1 as vf
    from pydantic import Field
    from verifiers.v1.runtimes import ProgramResult, SubprocessConfig
except ImportError:
    raise MissingExtraError("verifiers", "verifiers") from None

from kerneljudge.env import EnvConfig
from kerneljudge.env.rewards import SpeedupReward
from kerneljudge.verdict import Status, Verdict

__all__ = [
    "INFO_KEY",
    "TASKSET_ID",
    "KernelHarness",
    "KernelHarnessConfig",
    "KernelTask",
    "KernelTaskConfig",
    "KernelTaskData",
    "KernelTaskset",
    "KernelTasksetConfig",
    "load_environment",
]

#: The plugin id verifiers knows the taskset and the harness by (a top-level module).
TASKSET_ID = "kerneljudge_verifiers"
#: The key of the episode's result in ``trace.info``: a dict with ``episode_id``,
#: ``status``, ``reward`` (the default :class:`SpeedupReward` of the verdict, as the runner
#: reports it; the trace's reward is the rubric's, with :class:`KernelTaskConfig`'s knobs),
#: ``stop_reason``, ``submitted_by``, ``tool_calls``, ``turns``, ``transcript`` ("" unless
#: ``transcript_dir`` is set) and ``verdict`` (the final verdict's JSON, or None).
INFO_KEY = "kerneljudge"

#: Held while a candidate runs, by every episode of this process, so timings never overlap.
_DEVICE_LOCK = threading.Lock()


class KernelTaskData(vf.TaskData):
    """One problem's task: the problem (name or path) and the environment's configuration
    (:meth:`EnvConfig.to_dict`)."""

    problem: str
    env_config: dict[str, Any] = Field(default_factory=dict)


class KernelTaskConfig(vf.TaskConfig):
    """The rubric's knobs: the fields of :class:`~kerneljudge.env.rewards.SpeedupReward`."""

    baseline: str = "eager"
    cap: float = 16.0
    floor: float = 0.05
    use_lower_bound: bool = False

    def reward_fn(self) -> SpeedupReward:
        """The reward function these knobs describe.

        Raises:
            ValueError: ``cap`` <= 1 or ``floor`` outside [0, 1].
        """
        return SpeedupReward(self.baseline, self.cap, self.floor, self.use_lower_bound)


def _verdict(trace: Any) -> Verdict | None:
    result = trace.info.get(INFO_KEY) or {}
    data = result.get("verdict")
    return Verdict.from_dict(data) if data else None


class KernelTask(vf.Task[KernelTaskData, vf.State, KernelTaskConfig]):
    """A kerneljudge episode on one problem; scored from the episode's final verdict."""

    @vf.reward
    async def kernel_reward(self, trace: vf.Trace) -> float:
        """kerneljudge's reward of the final verdict (:class:`SpeedupReward`, 0 to 1)."""
        return float(self.config.reward_fn()(_verdict(trace)))

    @vf.metric
    async def correct(self, trace: vf.Trace) -> float:
        """1.0 when the final verdict is ``correct``, else 0.0."""
        verdict = _verdict(trace)
        return 1.0 if verdict is not None and verdict.status is Status.CORRECT else 0.0

    @vf.metric
    async def speedup_eager(self, trace: vf.Trace) -> float:
        """The median speedup over PyTorch eager of a correct verdict (0.0 without one)."""
        verdict = _verdict(trace)
        if verdict is None or verdict.status is not Status.CORRECT or verdict.timing is None:
            return 0.0
        found = verdict.timing.speedup("eager")
        return float(found.median) if found is not None else 0.0


class KernelTasksetConfig(vf.TasksetConfig):
    """Which problems, and the environment's options.

    Attributes:
        problems: bundled problem names or problem files.
        options: :class:`~kerneljudge.env.EnvConfig` fields (``max_tool_calls``, ``device``,
            ``baselines``, ...), as :func:`kerneljudge.integrations._common.env_config` takes.
        task: the rubric's knobs (:class:`KernelTaskConfig`).
    """

    id: str = TASKSET_ID
    task: KernelTaskConfig = KernelTaskConfig()
    problems: list[str] = Field(default_factory=lambda: ["causal_gqa"])
    options: dict[str, Any] = Field(default_factory=dict)


class KernelTaskset(vf.Taskset[KernelTask, KernelTasksetConfig]):
    """One :class:`KernelTask` per problem.

    Raises (on iteration):
        ValueError: an unknown option or a value :class:`EnvConfig` refuses.
    """

    def load(self) -> Iterable[KernelTask]:
        config = env_config(**self.config.options)
        for name in problem_list(self.config.problems):
            data = KernelTaskData(
                id=name,
                name=name,
                prompt=f"Write a faster ModelNew for the kerneljudge problem {name}.",
                problem=name,
                env_config=config.to_dict(),
            )
            yield KernelTask(data, self.config.task)


class KernelHarnessConfig(vf.HarnessConfig):
    """The harness's knobs: how kerneljudge's runner talks to the interception endpoint.

    Attributes:
        temperature, max_tokens: sampling sent with every request (None: the server's).
        request_timeout_s: limit of one model request (seconds).
        max_retries: retries of a request after a transient error.
        transcript_dir: where the runner writes its transcripts (None: a temporary folder,
            removed after the episode).
    """

    id: str = TASKSET_ID
    temperature: float | None = None
    max_tokens: int | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 5
    transcript_dir: str | None = None


class KernelHarness(vf.Harness[KernelHarnessConfig]):
    """Plays a :class:`KernelTask` with kerneljudge's runner, in this process.

    Every model call goes through the rollout's interception endpoint (so verifiers records
    it); the tools run through :class:`~kerneljudge.env.KernelEnv`, whose judge runs every
    candidate in its own sandboxed worker. The result (with the final verdict) goes to
    ``trace.info[INFO_KEY]``.
    """

    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = False
    EXECUTES_CODE = True

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        from kerneljudge.agent.config import RunnerConfig
        from kerneljudge.agent.runner import run_episode

        problem = str(getattr(data, "problem", "") or data.name or "")
        config = EnvConfig.from_dict(dict(getattr(data, "env_config", {}) or {}))
        runner = RunnerConfig(
            model=ctx.model,
            base_url=endpoint,
            api_key=secret,
            temperature=self.config.temperature,
            max_tokens=self.config.max_tokens,
            request_timeout_s=self.config.request_timeout_s,
            max_retries=self.config.max_retries,
        )

        def play(out_dir: str) -> Any:
            return run_episode(
                problem,
                runner,
                config,
                out_dir=out_dir,
                device_lock=_DEVICE_LOCK,
                reward=SpeedupReward(),
            )

        if self.config.transcript_dir:
            summary = await asyncio.to_thread(play, self.config.transcript_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="kerneljudge-vf-") as tmp:
                summary = await asyncio.to_thread(play, tmp)
        verdict = summary.verdict
        trace.info[INFO_KEY] = {
            "episode_id": summary.episode_id,
            "status": summary.status,
            "reward": summary.reward,
            "stop_reason": summary.stop_reason,
            "submitted_by": summary.submitted_by,
            "tool_calls": summary.tool_calls,
            "turns": summary.turns,
            "transcript": summary.transcript if self.config.transcript_dir else "",
            "verdict": verdict.to_dict() if verdict is not None else None,
        }
        return ProgramResult(exit_code=0, stdout=f"{summary.status} {summary.reward}", stderr="")


def load_environment(
    problems: str | list[str] = "causal_gqa",
    max_turns: int = 40,
    *,
    reward: dict[str, Any] | None = None,
    harness: dict[str, Any] | None = None,
    **options: Any,
) -> vf.Env:
    """A verifiers environment of kerneljudge episodes, one task per problem.

    Args:
        problems: bundled problem names or problem files (a list or ``"a,b"``).
        max_turns: model replies per episode (:attr:`EnvConfig.max_turns`).
        reward: :class:`KernelTaskConfig` fields (``baseline``, ``cap``, ``floor``,
            ``use_lower_bound``).
        harness: :class:`KernelHarnessConfig` fields (``temperature``, ``max_tokens``, ...).
        options: the other :class:`~kerneljudge.env.EnvConfig` fields (``max_tool_calls``,
            ``device``, ``baselines``, ``cache_dir``, ...).

    Returns:
        The environment (a ``verifiers.v1.SingleAgentEnv``); its agent runs on the local
        host (the subprocess runtime), where the judge's own sandbox confines candidates.

    Raises:
        ValueError: no problem, an unknown option, or a value that is refused.
    """
    options = {**options, "max_turns": max_turns}
    env_config(**options)  # refuse bad options now, not in the first rollout
    taskset = KernelTasksetConfig(
        problems=problem_list(problems),
        options=options,
        task=KernelTaskConfig(**(reward or {})),
    )
    agent = vf.AgentConfig(
        harness=KernelHarnessConfig(**(harness or {})),
        runtime=SubprocessConfig(),
    )
    config = vf.SingleAgentEnvConfig(taskset=taskset, agent=agent)
    return vf.load_environment(config)
