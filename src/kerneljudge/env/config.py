"""The environment's configuration: budget, judging knobs per tool, prompts.

:class:`EnvConfig` is frozen and round-trips through JSON (:meth:`EnvConfig.to_dict`,
:meth:`EnvConfig.from_dict`), so an episode's state can carry it to another process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kerneljudge.env.budget import ON_EXHAUSTED
from kerneljudge.errors import ConfigError
from kerneljudge.judge.config import (
    DEFAULT_BASELINES,
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_DEVICE,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
    check_fields,
    check_integer,
    check_seconds,
)

__all__ = ["EnvConfig"]

#: The fields :class:`EnvConfig` shares with :class:`~kerneljudge.judge.JudgeConfig`, checked
#: by the same rules (:func:`kerneljudge.judge.config.check_fields`).
_SHARED = (
    "device",
    "tolerance",
    "trials",
    "baselines",
    "graph_timing",
    "build_timeout_s",
    "run_timeout_s",
    "threads",
)


@dataclass(frozen=True)
class EnvConfig:
    """How an episode runs.

    Attributes:
        max_tool_calls: tool calls the model may make (each call counts, failed ones too).
        max_turns: model replies the runner asks for (a reply without a tool call counts too).
        on_exhausted: what happens when calls or turns run out before ``submit_kernel``:
            ``submit_last_passing`` (default: the last code that passed ``run_correctness`` or
            ``run_benchmark`` gets the full evaluation; failed when there is none),
            ``submit_last`` (the last code given to any tool), or ``fail`` (scored as failed).
        device: ``auto`` (the GPU when one is visible, else the CPU), ``cpu``, ``cuda``,
            ``cuda:N``. Every candidate runs there; the prompt describes it.
        tolerance: ``oracle`` or ``allclose`` (see :mod:`kerneljudge.check`).
        trials: correctness trials of ``run_correctness`` (public shapes).
        submit_trials: correctness trials per shape set of ``submit_kernel``.
        submit_shape_sets: the shape sets ``submit_kernel`` checks (None: all of the problem's).
        baselines: what ``run_benchmark`` and ``submit_kernel`` time against: ``eager``,
            ``compile`` (torch.compile).
        graph_timing: on a GPU, ``run_benchmark`` and ``submit_kernel`` also time CUDA-graph
            replays (device time) and show both speedups (see :class:`~kerneljudge.judge.
            JudgeConfig`).
        benchmark_time_s: timing budget of one ``run_benchmark`` (seconds).
        submit_time_s: timing budget of ``submit_kernel`` (seconds).
        profile: ``run_benchmark`` also profiles the candidate (torch.profiler).
        profile_calls: forward calls profiled.
        build_timeout_s: limit of one build (seconds).
        run_timeout_s: limit of one request to a candidate worker (seconds; None: derived per
            problem, see :class:`kerneljudge.judge.JudgeConfig`).
        cache_dir: the build cache (None: the judge's default).
        threads: torch threads in the workers (0: torch's default).
        prompt_dir: a folder of template files that replace the bundled ones by name
            (``system.md``, ``task.md``, ...; see :mod:`kerneljudge.env.prompts`).

    Raises:
        ConfigError: a value out of range (a :class:`ValueError`; the message names the field):
            ``max_tool_calls``, ``max_turns``, ``trials``, ``submit_trials`` and
            ``profile_calls`` integers of at least 1, ``threads`` at least 0,
            ``benchmark_time_s``, ``submit_time_s``, ``build_timeout_s`` and ``run_timeout_s``
            (when set) above 0 seconds, ``submit_shape_sets`` (when set) a non-empty list of
            names; ``device``, ``tolerance``, ``baselines``, ``on_exhausted`` one of theirs.
    """

    max_tool_calls: int = 30
    max_turns: int = 40
    on_exhausted: str = "submit_last_passing"
    device: str = DEFAULT_DEVICE
    tolerance: str = DEFAULT_TOLERANCE
    trials: int = DEFAULT_TRIALS
    submit_trials: int = 10
    submit_shape_sets: tuple[str, ...] | None = None
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    graph_timing: bool = True
    benchmark_time_s: float = 2.0
    submit_time_s: float = 4.0
    profile: bool = True
    profile_calls: int = 5
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S
    cache_dir: str | None = None
    threads: int = 0
    prompt_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_tool_calls", "max_turns"):
            check_integer(name, getattr(self, name), 1)
        if self.on_exhausted not in ON_EXHAUSTED:
            raise ConfigError(
                "on_exhausted",
                f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, not {self.on_exhausted!r}",
            )
        check_fields(self, _SHARED)
        check_integer("submit_trials", self.submit_trials, 1)
        sets = self.submit_shape_sets
        if sets is not None and (
            isinstance(sets, str) or not sets or not all(isinstance(x, str) and x for x in sets)
        ):
            raise ConfigError(
                "submit_shape_sets",
                f"submit_shape_sets must be a non-empty list of names, not {sets!r}",
            )
        check_seconds("benchmark_time_s", self.benchmark_time_s)
        check_seconds("submit_time_s", self.submit_time_s)
        check_integer("profile_calls", self.profile_calls, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvConfig:
        """Rebuild from :meth:`to_dict` output; unknown keys are ignored (newer writers).

        Raises:
            ConfigError: a value out of range (see the attributes).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("baselines", "submit_shape_sets"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> EnvConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
