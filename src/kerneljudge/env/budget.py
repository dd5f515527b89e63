"""The budget: tool calls and model turns left, and what happens when they run out.

Every tool call counts, including calls the environment answers with a tool error (bad
arguments, empty code): otherwise a model stuck in a loop of malformed calls would never end.
A model turn is one reply of the model; the runner counts it (:meth:`KernelEnv.begin_turn`).

When either runs out before ``submit_kernel``, :data:`ON_EXHAUSTED` names the policies:

``submit_last_passing`` (default)
    the last code that passed ``run_correctness`` (or a correct ``run_benchmark``) gets the
    full evaluation ``submit_kernel`` would have given it; with none, the episode is scored as
    failed (reward 0, no verdict).
``submit_last``
    the last code given to any tool gets the full evaluation (failed when no tool got code).
``fail``
    the episode is scored as failed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ON_EXHAUSTED", "Budget"]

#: The policies for a budget that runs out without a submission.
ON_EXHAUSTED = ("submit_last_passing", "submit_last", "fail")


@dataclass(frozen=True)
class Budget:
    """What is left of an episode's budget.

    Attributes:
        max_tool_calls, max_turns: the limits.
        calls_used, turns_used: what has been spent.
    """

    max_tool_calls: int
    max_turns: int
    calls_used: int = 0
    turns_used: int = 0

    @property
    def calls_left(self) -> int:
        return max(0, self.max_tool_calls - self.calls_used)

    @property
    def turns_left(self) -> int:
        return max(0, self.max_turns - self.turns_used)

    @property
    def exhausted(self) -> str:
        """``"tool_calls"`` or ``"turns"`` when that limit is reached, else ``""``."""
        if self.calls_left == 0:
            return "tool_calls"
        if self.turns_left == 0:
            return "turns"
        return ""

    def line(self) -> str:
        """The budget sentence that ends every observation."""
        text = f"[Budget: {self.calls_left} of {self.max_tool_calls} tool calls left"
        turns = self.turns_left
        if turns <= 3:
            text += f", {turns} {'reply' if turns == 1 else 'replies'} left"
        return text + ".]"
