"""The agent environment: tools, budget, prompts and rewards around the judge.

An episode in ten lines::

    from kerneljudge.env import EnvConfig, KernelEnv, ToolCall

    with KernelEnv("causal_gqa", EnvConfig(max_tool_calls=10)) as env:
        task = env.reset()          # task.messages (system + prompt), task.tools (schemas)
        code = open("my_kernel.py").read()
        result = env.step(ToolCall("run_correctness", {"kernel_code": code}))
        print(result.observation)
        result = env.step(ToolCall("submit_kernel", {"kernel_code": code}))
        print(result.done, result.reward, result.info.verdict.status)

Every tool returns one frozen :class:`Observation` (its text, the verdict or build result it came
from, its code); the environment reads it to keep the episode's state and builds each step's
:class:`StepResult` from it (``result.info.result``).

This package needs nothing beyond the judge's own dependencies (no ``openai``); the runner that
drives a model server lives in :mod:`kerneljudge.agent`. See ``docs/environment.md``.
"""

from kerneljudge.env._env import EpisodeOver, KernelEnv, StepInfo, StepResult, Task, ToolCall
from kerneljudge.env._tool import Tool, ToolError, tool
from kerneljudge.env.budget import ON_EXHAUSTED, Budget
from kerneljudge.env.config import EnvConfig
from kerneljudge.env.observations import Observation
from kerneljudge.env.prompts import TEMPLATE_NAMES, bundled_prompts_dir
from kerneljudge.env.rewards import RewardFn, SpeedupReward, default_reward
from kerneljudge.env.state import CallRecord, EpisodeState
from kerneljudge.env.tools import TOOL_NAMES, default_tools

__all__ = [
    "ON_EXHAUSTED",
    "TEMPLATE_NAMES",
    "TOOL_NAMES",
    "Budget",
    "CallRecord",
    "EnvConfig",
    "EpisodeOver",
    "EpisodeState",
    "KernelEnv",
    "Observation",
    "RewardFn",
    "SpeedupReward",
    "StepInfo",
    "StepResult",
    "Task",
    "Tool",
    "ToolCall",
    "ToolError",
    "bundled_prompts_dir",
    "default_reward",
    "default_tools",
    "tool",
]
