"""The lint's results: one :class:`LintCheck` per check, one :class:`LintReport` per problem
and shape set, and the :class:`LintLimits` the ``fits`` check holds the reference to."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CHECK_NAMES", "LintCheck", "LintLimits", "LintReport"]

CHECK_NAMES = (
    "load",
    "metadata",
    "output_shape",
    "finite",
    "deterministic",
    "inputs_unchanged",
    "magnitude",
    "nulls_fail",
    "inputs_matter",
    "weights_matter",
    "weights_vary",
    "counts",
    "fits",
    "not_launch_bound",
)


@dataclass(frozen=True)
class LintLimits:
    """What the reference may use at the linted shape set.

    Attributes:
        time_s: wall time of one reference call, seconds.
        memory_bytes: inputs + outputs + parameters, bytes: what a candidate must hold too.
        peak_memory_bytes: on CUDA, the peak memory allocated during one reference call
            (intermediates included), bytes. 16 GiB is a fifth of an 80 GB H100, so the
            reference, its float64 oracle and a candidate fit on one card side by side.
    """

    time_s: float = 10.0
    memory_bytes: int = 4 * 1024**3
    peak_memory_bytes: int = 16 * 1024**3


@dataclass(frozen=True)
class LintCheck:
    """The outcome of one check.

    Attributes:
        name: one of :data:`CHECK_NAMES`.
        passed: the check holds (also True when it was skipped).
        detail: what was measured, or why it failed; ``"n/a: ..."`` when skipped.
        required: a failure fails the report; False makes it a warning.
        skipped: the check does not apply (e.g. weights of a model without parameters).
    """

    name: str
    passed: bool
    detail: str = ""
    required: bool = True
    skipped: bool = False


@dataclass(frozen=True)
class LintReport:
    """The lint of one problem at one shape set.

    Attributes:
        problem: the problem's name (the spec, when it did not load).
        path: the problem file ("" when it was not found).
        shape_set: the linted shape set; None for a file without ``SHAPE_SETS``.
        device: the device the reference ran on.
        checks: one :class:`LintCheck` per check run, in :data:`CHECK_NAMES` order.
        duration_s: wall time of the whole lint, seconds.
    """

    problem: str
    path: str
    shape_set: str | None
    device: str
    checks: tuple[LintCheck, ...]
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Every required check passed."""
        return all(c.passed or not c.required for c in self.checks)

    @property
    def failures(self) -> list[LintCheck]:
        """Required checks that failed."""
        return [c for c in self.checks if c.required and not c.passed]

    @property
    def warnings(self) -> list[LintCheck]:
        """Optional checks that failed."""
        return [c for c in self.checks if not c.required and not c.passed]

    def check(self, name: str) -> LintCheck | None:
        """The check called ``name``, or None when it did not run."""
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``passed`` added."""
        return {**asdict(self), "passed": self.passed}
