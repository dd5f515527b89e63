"""kerneljudge as an Inspect AI task: the four tools as Inspect tools, a scorer from the verdict.

::

    inspect eval src/kerneljudge/integrations/inspect.py@kernel_task \\
        -T problem=causal_gqa -T max_tool_calls=10 --model openai/my-model
    inspect eval kerneljudge/kernel_task -T problem=causal_gqa,triangle_attention ...

(the second form through the package's ``inspect_ai`` entry point, once kerneljudge is
installed with the ``[inspect]`` extra). One sample per problem. Each sample runs its own
:class:`~kerneljudge.env.KernelEnv` (its own judge and worker processes); samples of one task
share a lock, held while a candidate runs, so their timings never overlap.

The episode loop is the runner's (:mod:`kerneljudge.agent.runner`): the system and task
prompts, then per model reply one turn of the budget, the reply's tool calls in order (each
observation a ``tool`` message), the reminder for a reply without a tool call, and the
exhaustion policy when calls or turns run out (or when Inspect's own limits end the sample).
The score's value is the episode's reward (:mod:`kerneljudge.env.rewards`, 0 to 1), its answer
the final verdict's status (``none`` without a verdict).

Importing this module without ``inspect_ai`` raises
:class:`~kerneljudge.integrations._common.MissingExtraError` (``install kerneljudge[inspect]``).
"""

from __future__ import annotations

import threading
from typing import Any

from kerneljudge.integrations._common import MissingExtraError, env_config, problem_list

try:
    import anyio
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser, execute_tools
    from inspect_ai.scorer import Score, Target, mean, scorer
    from inspect_ai.solver import Generate, Solver, TaskState, solver
    from inspect_ai.tool import ToolDef, ToolParam, ToolParams
except ImportError:
    raise MissingExtraError("inspect", "inspect-ai") from None

from kerneljudge.env import EnvConfig, KernelEnv, ToolCall
from kerneljudge.env.rewards import RewardFn

__all__ = ["RESULT_KEY", "kernel_scorer", "kernel_solver", "kernel_task", "kernel_tools"]

#: The key of the episode's result in a sample's store (``state.store``): a dict with
#: ``reward`` (float or None), ``status`` (verdict status or ``none``), ``stop_reason``,
#: ``submitted_by``, ``tool_calls``, ``turns``, ``speedup_eager``, ``episode_id`` and
#: ``verdict`` (the final verdict's JSON, :meth:`~kerneljudge.verdict.Verdict.to_dict`, or None).
RESULT_KEY = "kerneljudge:result"


def kernel_tools(env: KernelEnv) -> list[ToolDef]:
    """The environment's tools as Inspect tools, with the environment's own names,
    descriptions and parameter schemas (from ``env.task().tools``).

    Each tool steps ``env`` (in a worker thread; the judge blocks) and returns the observation
    text. A call that arrives after the episode ended returns a note and runs nothing.
    """
    defs = []
    for schema in (t.schema() for t in env.tools):
        fn = schema["function"]
        defs.append(_tool_def(env, fn["name"], fn["description"], fn["parameters"]))
    return defs


def _tool_def(env: KernelEnv, name: str, description: str, params: dict[str, Any]) -> ToolDef:
    async def execute(**arguments: Any) -> str:
        if env.done:
            return f"{name} was not run: the episode is over ({env.state.stop_reason})."
        result = await anyio.to_thread.run_sync(env.step, ToolCall(name, dict(arguments)))
        return result.observation

    properties = {
        key: ToolParam(type=spec.get("type"), description=spec.get("description"))
        for key, spec in params.get("properties", {}).items()
    }
    parameters = ToolParams(properties=properties, required=list(params.get("required", [])))
    return ToolDef(execute, name=name, description=description, parameters=parameters)


def _result(env: KernelEnv) -> dict[str, Any]:
    state = env.state
    verdict = env.final_verdict
    speedup = None
    if verdict is not None and verdict.timing is not None:
        found = verdict.timing.speedup("eager")
        speedup = found.median if found is not None else None
    return {
        "episode_id": state.episode_id,
        "reward": state.reward,
        "status": verdict.status.value if verdict is not None else "none",
        "stop_reason": state.stop_reason,
        "submitted_by": state.submitted_by,
        "tool_calls": state.calls_used,
        "turns": state.turns_used,
        "speedup_eager": speedup,
        "verdict": state.verdict,
    }


@solver
def kernel_solver(
    config: EnvConfig | None = None,
    reward: RewardFn | None = None,
    device_lock: Any = None,
) -> Solver:
    """Run one kerneljudge episode on the sample's problem (``sample.metadata["problem"]``).

    The sample's messages are replaced by the environment's system and task prompts; the
    result goes to ``state.store[RESULT_KEY]`` and the scorer reads it from there.

    Args:
        config: the environment's configuration (default :class:`EnvConfig`).
        reward: the reward function (None: :data:`~kerneljudge.env.rewards.default_reward`).
        device_lock: a lock shared by the samples on one device (None: a new one).
    """
    lock = device_lock if device_lock is not None else threading.Lock()

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        problem = str(state.metadata.get("problem") or state.sample_id)
        env = await anyio.to_thread.run_sync(
            lambda: KernelEnv(problem, config, reward=reward, device_lock=lock)
        )
        try:
            task_ = await anyio.to_thread.run_sync(env.reset)
            state.messages = [
                ChatMessageSystem(content=task_.system),
                ChatMessageUser(content=task_.prompt),
            ]
            state.tools = kernel_tools(env)
            state = await _episode(env, state, generate)
        finally:
            if not env.done:
                final = await anyio.to_thread.run_sync(env.finish, "stopped")
                state.messages.append(ChatMessageUser(content=final.observation))
            state.store.set(RESULT_KEY, _result(env))
            await anyio.to_thread.run_sync(env.close)
        state.completed = True
        return state

    return solve


async def _episode(env: KernelEnv, state: TaskState, generate: Generate) -> TaskState:
    while not env.done:
        env.begin_turn()
        state = await generate(state, tool_calls="none")
        if state.completed:  # an Inspect limit (messages, tokens, time) ended the sample
            return state
        message = state.output.message
        if message.tool_calls:
            result = await execute_tools(state.messages, state.tools)
            state.messages.extend(result.messages)
        else:
            state.messages.append(ChatMessageUser(content=env.nudge()))
        if not env.done:  # the last reply allowed may apply the exhaustion policy (a submission)
            final = await anyio.to_thread.run_sync(env.end_turn)
            if final is not None:
                state.messages.append(ChatMessageUser(content=final.observation))
    return state


@scorer(metrics=[mean()])
def kernel_scorer():
    """The episode's reward as the score (0 to 1); the verdict's status as its answer."""

    async def score(state: TaskState, target: Target) -> Score:
        result = state.store.get(RESULT_KEY)
        if not result:
            return Score(value=0.0, answer="none", explanation="the episode did not run")
        reward = result.get("reward")
        explanation = (
            f"{result['status']} ({result['stop_reason'] or 'running'}, "
            f"{result['tool_calls']} tool calls, {result['turns']} turns)"
        )
        meta = {k: v for k, v in result.items() if k != "verdict"}
        return Score(
            value=float(reward or 0.0),
            answer=str(result["status"]),
            explanation=explanation,
            metadata=meta,
        )

    return score


@task
def kernel_task(
    problem: str | list[str] = "causal_gqa",
    max_tool_calls: int = 30,
    max_turns: int = 40,
    on_exhausted: str = "submit_last_passing",
    device: str = "auto",
    tolerance: str = "oracle",
    trials: int = 5,
    submit_trials: int = 10,
    submit_shape_sets: str | list[str] | None = None,
    baselines: str | list[str] = "eager,compile",
    benchmark_time_s: float = 2.0,
    submit_time_s: float = 4.0,
    profile: bool = True,
    cache_dir: str | None = None,
    prompt_dir: str | None = None,
) -> Task:
    """kerneljudge episodes, one sample per problem (``-T problem=a,b``).

    Every other argument is the :class:`~kerneljudge.env.EnvConfig` field of that name
    (``baselines`` and ``submit_shape_sets`` also as comma-separated strings).

    Raises:
        ValueError: no problem, or an option :class:`EnvConfig` refuses.
    """
    config = env_config(
        max_tool_calls=max_tool_calls,
        max_turns=max_turns,
        on_exhausted=on_exhausted,
        device=device,
        tolerance=tolerance,
        trials=trials,
        submit_trials=submit_trials,
        submit_shape_sets=submit_shape_sets,
        baselines=baselines,
        benchmark_time_s=benchmark_time_s,
        submit_time_s=submit_time_s,
        profile=profile,
        cache_dir=cache_dir,
        prompt_dir=prompt_dir,
    )
    samples = [
        Sample(
            input=f"Write a faster ModelNew for the kerneljudge problem {name}.",
            id=name,
            metadata={"problem": name},
        )
        for name in problem_list(problem)
    ]
    return Task(
        dataset=MemoryDataset(samples, name="kerneljudge"),
        solver=kernel_solver(config),
        scorer=kernel_scorer(),
    )
