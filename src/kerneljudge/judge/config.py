"""How to judge: :class:`JudgeConfig`, its defaults and the checks of its fields.

The defaults here are the ones :class:`JudgeConfig`, :class:`kerneljudge.env.EnvConfig` and
the command-line options (``kerneljudge eval``, ``suite run``, ``episode``) start from. The
field checks (:func:`check_fields`) are shared with :class:`~kerneljudge.env.EnvConfig` for
the fields both have; a bad value raises :class:`~kerneljudge.errors.ConfigError`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneljudge.build import DEFAULT_BUILD_TIMEOUT_S
from kerneljudge.errors import ConfigError
from kerneljudge.timing import TimingConfig

__all__ = [
    "BASELINES",
    "DEFAULT_BASELINES",
    "DEFAULT_BUILD_TIMEOUT_S",
    "DEFAULT_DEVICE",
    "DEFAULT_RUN_TIMEOUT_S",
    "DEFAULT_SHAPE_SETS",
    "DEFAULT_TOLERANCE",
    "DEFAULT_TRIALS",
    "TOLERANCES",
    "JudgeConfig",
    "check_fields",
    "check_integer",
    "check_seconds",
]

#: ``auto`` (GPU for cuda/triton, CPU for cpp/torch), ``cpu``, ``cuda``, ``cuda:N``.
DEFAULT_DEVICE = "auto"
#: Correctness trials per shape set.
DEFAULT_TRIALS = 5
#: The tolerance rules (:mod:`kerneljudge.check`).
TOLERANCES = ("oracle", "allclose")
DEFAULT_TOLERANCE = "oracle"
#: The reference baselines a candidate can be timed against (``compile``: torch.compile).
BASELINES = ("eager", "compile")
DEFAULT_BASELINES: tuple[str, ...] = BASELINES
DEFAULT_SHAPE_SETS: tuple[str, ...] = ("public",)
#: Limit of one request to a candidate worker: import, one trial (seconds). None: derived per
#: verdict from the reference's measured call and the bytes a request moves, between a floor
#: and a cap (:class:`kerneljudge.check.limits.RunLimits`).
DEFAULT_RUN_TIMEOUT_S: float | None = None

_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def _device(name: str, value: Any) -> None:
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        raise ConfigError(name, f"{name} must be auto, cpu, cuda or cuda:N, not {value!r}")


def check_integer(name: str, value: Any, low: int) -> None:
    """Check that field ``name`` holds an integer (not a bool) of at least ``low``.

    Raises:
        ConfigError: it does not (the message names the field).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(name, f"{name} must be an integer of at least {low}, not {value!r}")


def check_seconds(name: str, value: Any, *, zero: bool = False) -> None:
    """Check that field ``name`` holds a number of seconds above 0 (at least 0 with ``zero``);
    NaN and bools are refused.

    Raises:
        ConfigError: it does not (the message names the field).
    """
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    if not (ok and (value >= 0 if zero else value > 0)):
        what = "a number of seconds of at least 0" if zero else "a positive number of seconds"
        raise ConfigError(name, f"{name} must be {what}, not {value!r}")


def _at_least(low: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        check_integer(name, value, low)

    return check


def _positive(name: str, value: Any) -> None:
    check_seconds(name, value)


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None:
        _positive(name, value)


def _non_negative_or_none(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(name, f"{name} must be a number of at least 0, not {value!r}")


def _tolerance(name: str, value: Any) -> None:
    if value not in TOLERANCES:
        raise ConfigError(name, f"{name} must be oracle or allclose, not {value!r}")


def _baselines(name: str, value: Any) -> None:
    if isinstance(value, str):
        raise ConfigError(name, f"{name} must be a list of eager, compile, not {value!r}")
    unknown = [b for b in value if b not in BASELINES]
    if unknown:
        raise ConfigError(name, f"unknown {name} {unknown} (use eager, compile)")


def _boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, f"{name} must be true or false, not {value!r}")


def _timing_config(name: str, value: Any) -> None:
    # Its budget is checked under the name of its own field (``--max-time`` on the command
    # line): NaN, 0 or less timed one round, NaN or infinity never stopped on time.
    if not isinstance(value, TimingConfig):
        raise ConfigError(name, f"{name} must be a TimingConfig, not {value!r}")
    check_seconds("max_time_s", value.max_time_s)
    if not math.isfinite(value.max_time_s):
        raise ConfigError("max_time_s", f"max_time_s must be finite, not {value.max_time_s!r}")


def _shape_sets(name: str, value: Any) -> None:
    if isinstance(value, str) or not value or not all(isinstance(s, str) and s for s in value):
        raise ConfigError(name, f"{name} must be a non-empty list of names, not {value!r}")


#: The check of each field, by name (a field's check raises ConfigError naming it).
_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "device": _device,
    "trials": _at_least(1),
    "tolerance": _tolerance,
    "atol": _non_negative_or_none,
    "rtol": _non_negative_or_none,
    "shape_sets": _shape_sets,
    "baselines": _baselines,
    "graph_timing": _boolean,
    "timing_config": _timing_config,
    "build_timeout_s": _positive,
    "run_timeout_s": _positive_or_none,
    "memory_budget_mib": _at_least(0),
    "threads": _at_least(0),
}


def check_fields(config: object, names: Iterable[str] | None = None) -> None:
    """Check the named fields of ``config`` (None: every field that has a check), in order.

    Ranges: ``device`` auto|cpu|cuda|cuda:N; ``trials`` >= 1; ``tolerance`` oracle|allclose;
    ``atol``/``rtol`` None or >= 0; ``shape_sets`` non-empty; ``baselines`` a subset of
    eager, compile; ``graph_timing`` a bool; ``timing_config`` a :class:`TimingConfig` whose
    ``max_time_s`` is finite and > 0 seconds (the error names ``max_time_s``);
    ``build_timeout_s`` > 0 seconds;
    ``run_timeout_s`` None or > 0 seconds; ``memory_budget_mib``, ``threads`` integers >= 0.

    Raises:
        ConfigError: the first field out of its range (the message names it).
    """
    for name in _CHECKS if names is None else names:
        _CHECKS[name](name, getattr(config, name))


@dataclass(frozen=True)
class JudgeConfig:
    """How to judge. Validated when made (:func:`check_fields`); ``kerneljudge eval`` has an
    option for every field but ``timing_config`` (only its ``max_time_s``: ``--max-time``)
    and ``threads``; the option names drop the ``_s``/``_mib`` unit suffixes.

    Attributes:
        device: ``auto`` (GPU for cuda/triton, CPU for cpp/torch), ``cpu``, ``cuda``, ``cuda:N``.
        trials: correctness trials per shape set, each with fresh inputs.
        tolerance: ``oracle`` (float64-oracle rule) or ``allclose`` (see :mod:`kerneljudge.check`).
        atol, rtol: override the problem's allclose tolerances.
        shape_sets: which of the problem's shape sets to check; timing uses the last one.
        timing: time a correct candidate.
        baselines: reference baselines to time: ``eager`` and/or ``compile`` (torch.compile).
        graph_timing: on a CUDA device, after the launched calls, time every contestant again
            by CUDA-graph replay (device time, independent of the host's speed) and say how
            host-bound each launched call is (:mod:`kerneljudge.timing.graph_pass`; the
            verdict's ``timing.graph``). Ignored on a CPU.
        timing_config: the timing protocol's knobs.
        build_timeout_s: limit of one build (seconds).
        run_timeout_s: limit of one request to a candidate worker: import, one trial (seconds;
            the reference's requests may take at least this long). None: derived per shape set
            from the reference's measured call and the bytes a request moves, at least 20 s
            and at most 600 s plus 30 s per GiB moved (:class:`kerneljudge.check.limits.
            RunLimits`); the verdict records the limits used (``Verdict.limits``). A timing
            batch's limit scales with the calls it asks for, from this floor up to 5x it
            (:class:`kerneljudge.timing.BatchLimit`).
        cache_dir: the build cache (None: :func:`kerneljudge.build.default_cache_dir`).
        seed: the run seed (None: a fresh secret one per evaluation).
        memory_budget_mib: memory this process may use above its base to relay one trial's
            inputs (MiB; 0: the host's available memory when the trials start); a problem whose
            inputs it sends (on a CPU) and that need more is a
            :class:`~kerneljudge.errors.ProblemError`
            (:func:`kerneljudge.check.memory.check_budget`); a candidate's reply longer than
            half of it ends its worker unread, and a candidate whose own draw differs is not
            sent inputs longer than that: ``runtime_error``.
        threads: torch threads in the workers (0: torch's default). While timing on a CPU,
            both timed workers run one thread per timing core, or this many when fewer
            (:func:`kerneljudge.timing.hostload.timing_cores`).

    Raises:
        ConfigError: a field out of its range (see :func:`check_fields`).
    """

    device: str = DEFAULT_DEVICE
    trials: int = DEFAULT_TRIALS
    tolerance: str = DEFAULT_TOLERANCE
    atol: float | None = None
    rtol: float | None = None
    shape_sets: tuple[str, ...] = DEFAULT_SHAPE_SETS
    timing: bool = True
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    graph_timing: bool = True
    timing_config: TimingConfig = field(default_factory=TimingConfig)
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    run_timeout_s: float | None = DEFAULT_RUN_TIMEOUT_S
    cache_dir: Path | None = None
    seed: int | None = None
    memory_budget_mib: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        check_fields(self)

    def ordered_shape_sets(self) -> list[str]:
        """The configured shape sets without repeats, ``public`` last (it is the one timed)."""
        sets = list(dict.fromkeys(self.shape_sets))
        if "public" in sets:
            sets.remove("public")
            sets.append("public")
        return sets
