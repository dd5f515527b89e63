"""JudgeOptions: the JSON-ready subset of :class:`~kerneljudge.judge.JudgeConfig` that travels
with a job or a suite run (stored with it, sent over HTTP, handed to another process)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kerneljudge.errors import ConfigError
from kerneljudge.judge.config import (
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_DEVICE,
    DEFAULT_RUN_TIMEOUT_S,
    DEFAULT_SHAPE_SETS,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
    JudgeConfig,
)
from kerneljudge.timing import TimingConfig

__all__ = ["JudgeOptions"]


@dataclass(frozen=True)
class JudgeOptions:
    """How to judge, as plain data. Field meanings are :class:`JudgeConfig`'s; ``max_time_s``
    is the timing budget per candidate in seconds (None: the timing protocol's default);
    ``run_timeout_s`` None (the default) derives the request limits per problem.
    The eager baseline alone by default: the suite's metrics use the eager speedup.
    """

    device: str = DEFAULT_DEVICE
    trials: int = DEFAULT_TRIALS
    tolerance: str = DEFAULT_TOLERANCE
    timing: bool = True
    baselines: tuple[str, ...] = ("eager",)
    graph_timing: bool = True
    shape_sets: tuple[str, ...] = DEFAULT_SHAPE_SETS
    max_time_s: float | None = None
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S
    cache_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        d = asdict(self)
        for key in ("baselines", "shape_sets"):
            d[key] = list(d[key])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], strict: bool = False) -> JudgeOptions:
        """Read :meth:`to_dict`'s form; keys not named here are ignored, or with ``strict``
        refused.

        Raises:
            ValueError: (with ``strict``) an unknown key; a value of the wrong type or out of
                its range (:class:`~kerneljudge.errors.ConfigError`, a ``ValueError``); the
                message says which field, one line.
        """
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if strict and unknown:
            raise ValueError(f"unknown option {unknown[0]!r}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("baselines", "shape_sets"):
            if key in known:
                value = known[key]
                if isinstance(value, str) or not isinstance(value, list | tuple):
                    raise ValueError(f"option {key} must be a list of strings")
                known[key] = tuple(value)
        options = cls(**known)
        options.judge_config()  # every range check of JudgeConfig
        return options

    def judge_config(self) -> JudgeConfig:
        """The :class:`JudgeConfig` these options stand for.

        Raises:
            ConfigError: a field out of its range (or of the wrong type).
        """
        if self.max_time_s is not None and (
            isinstance(self.max_time_s, bool)
            or not isinstance(self.max_time_s, int | float)
            or not self.max_time_s > 0
        ):
            raise ConfigError(
                "max_time_s", f"max_time_s must be a number > 0, not {self.max_time_s!r}"
            )
        if not isinstance(self.timing, bool):
            raise ConfigError("timing", f"timing must be true or false, not {self.timing!r}")
        timing = TimingConfig(max_time_s=self.max_time_s) if self.max_time_s else TimingConfig()
        try:
            return JudgeConfig(
                device=self.device,
                trials=self.trials,
                tolerance=self.tolerance,
                timing=self.timing,
                baselines=self.baselines,
                graph_timing=self.graph_timing,
                shape_sets=self.shape_sets,
                timing_config=timing,
                build_timeout_s=self.build_timeout_s,
                run_timeout_s=self.run_timeout_s,
                cache_dir=Path(self.cache_dir) if self.cache_dir else None,
            )
        except TypeError as exc:  # a range check met a value of another type
            message = f"an option has a value of the wrong type: {exc}"
            raise ConfigError("options", message) from None
