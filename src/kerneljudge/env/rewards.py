"""Rewards: the number an episode ends with.

A reward function takes the final :class:`~kerneljudge.verdict.Verdict` (None when the episode
ended without one: nothing submitted and nothing to submit) and returns a float. The default,
:class:`SpeedupReward`, is 0 unless the verdict is ``correct``; a correct candidate gets

    ``clip(0.5 + 0.5 * log(speedup) / log(cap), floor, 1.0)``

where ``speedup`` is the median speedup over the ``eager`` baseline: 0.5 at parity, 1.0 at
``cap`` times faster (16 by default) or more, ``floor`` (0.05) for a very slow but correct one,
and 0.5 when the verdict carries no timing. ``timing="graph"`` takes the speedup of CUDA-graph
replays (device time, independent of the host's speed: ``Verdict.timing.graph``) where the
verdict has it. Where the candidate could not be captured but the baseline was, it takes the
baseline's replay median over the candidate's launched median: the candidate's launched time
holds its host overhead too, so a candidate gains nothing by refusing capture (its launched
speedup over a host-bound baseline can be several times its replay speedup). Where the graph
pass did not run (a CPU verdict, ``graph_timing`` off) or no baseline was captured, the launched
calls' speedup. Pass any callable with the same signature instead
(``KernelEnv(..., reward=my_reward)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kerneljudge.verdict import Speedup, Status, TimingResult, Verdict

__all__ = ["RewardFn", "SpeedupReward", "default_reward"]

#: ``reward(verdict or None) -> float``.
RewardFn = Callable[[Verdict | None], float]


@dataclass(frozen=True)
class SpeedupReward:
    """0 unless correct; otherwise increasing in the log of the speedup, clipped.

    Attributes:
        baseline: the baseline whose speedup counts (``eager`` or ``compile``); when the verdict
            has no speedup over it, the first speedup it has is used.
        cap: the speedup that earns the full reward 1.0 (must be > 1).
        floor: the reward of a correct candidate however slow (>= 0).
        use_lower_bound: use the lower end of the speedup's 95% interval instead of its median
            (rewards only speedups the measurement is sure of).
        timing: ``launch`` (the launched calls' speedup) or ``graph`` (the graph replays',
            where measured, else the launched calls').
    """

    baseline: str = "eager"
    cap: float = 16.0
    floor: float = 0.05
    use_lower_bound: bool = False
    timing: str = "launch"

    def __post_init__(self) -> None:
        if self.timing not in ("launch", "graph"):
            raise ValueError(f"timing must be launch or graph, not {self.timing!r}")
        if self.cap <= 1.0:
            raise ValueError(f"cap must be above 1, not {self.cap}")
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError(f"floor must be within [0, 1], not {self.floor}")

    def __call__(self, verdict: Verdict | None) -> float:
        if verdict is None or verdict.status is not Status.CORRECT:
            return 0.0
        timing = verdict.timing
        speedup = None
        if timing is not None and self.timing == "graph" and timing.graph is not None:
            speedup = timing.graph.speedup(self.baseline) or _uncaptured(timing, self.baseline)
        if timing is not None and speedup is None:
            speedup = timing.speedup(self.baseline) or next(iter(timing.speedups), None)
        if speedup is None:
            return 0.5
        value = speedup.ci95[0] if self.use_lower_bound else speedup.median
        if not value or value <= 0 or not math.isfinite(value):
            return self.floor
        raw = 0.5 + 0.5 * math.log(value) / math.log(self.cap)
        return float(min(1.0, max(self.floor, raw)))


def _uncaptured(timing: TimingResult, baseline: str) -> Speedup | None:
    """The baseline's replay median over the candidate's launched median (its interval: the
    baseline's replay interval over the candidate's launched one), when the candidate was not
    captured and the baseline's replays were timed; else None."""
    graph = timing.graph
    base = graph.measurement(baseline) if graph is not None else None
    cand = timing.measurement("candidate")
    if graph is None or "candidate" not in graph.not_captured or base is None or cand is None:
        return None
    if not (cand.median_ms > 0 and cand.ci95_ms[0] > 0 and cand.ci95_ms[1] > 0):
        return None
    point = base.median_ms / cand.median_ms
    lo, hi = base.ci95_ms[0] / cand.ci95_ms[1], base.ci95_ms[1] / cand.ci95_ms[0]
    return Speedup(baseline, point, (lo, hi))


#: The default reward: :class:`SpeedupReward` with its defaults.
default_reward: RewardFn = SpeedupReward()
