"""Time limits of the requests to the workers, derived from the problem's size and the
reference's measured call time.

A verdict's limits follow its problem: the reference's preparation (before any candidate code
runs) runs each shape set's trials and measures each call (the reference worker's own clock
around the call, :attr:`~kerneljudge.check.reference.HeldTrial.call_s`; where a worker does not
report it, the run's request on the supervisor's clock, :attr:`~HeldTrial.wall_s`); a
candidate's request on that shape set may then take

    ``max(floor_s, min(cap_s, factor x reference call) + transfer_s_per_gib x GiB moved)``

(:meth:`RunLimits.run_s`; the cap bounds the scaled call, the bytes bound the transfer), so
a problem whose reference takes seconds a call, or whose inputs are gigabytes, is never a
``timeout`` for an honest candidate, while a hang in a small problem's candidate ends after
``floor_s``. An explicit ``run_timeout_s`` replaces the derived
limit of every candidate request. The reference's own requests (trusted code) may take at least
:meth:`RunLimits.reference_s`, a limit from the bytes it moves alone, since nothing of it is
measured before its first run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kerneljudge.verdict import RequestLimits

if TYPE_CHECKING:
    from kerneljudge.problem import Problem

__all__ = [
    "meta_weight_bytes",
    "CAP_S",
    "FACTOR",
    "FIRST_CALL_FLOOR_S",
    "FLOOR_S",
    "LOAD_FLOOR_S",
    "REFERENCE_FLOOR_S",
    "REFERENCE_S_PER_GIB",
    "TRANSFER_S_PER_GIB",
    "RunLimits",
    "SetLimits",
    "tensor_bytes",
]

#: Least limit of a candidate's request (seconds): a loaded host stalls a worker for seconds;
#: a hang in a small problem's candidate still ends this soon (the fixed limit was 120 s). The
#: first trial of each shape set gets at least :data:`FIRST_CALL_FLOOR_S`.
FLOOR_S = 20.0
#: Least limit of a candidate's ``setup`` and first trial on each shape set (seconds): its
#: ``__init__`` and first call may compile its kernels (Triton's JIT and autotuning,
#: ``torch.compile``: tens of seconds, more on a loaded host); the fixed limit every request
#: had before limits were derived.
FIRST_CALL_FLOOR_S = 120.0
#: A candidate's request may take this many times the reference's measured call: an honest
#: first kernel may be 50x slower than the reference (a naive loop where the reference calls
#: a library), and a loaded host can double that.
FACTOR = 100.0
#: Most seconds a candidate's request gets for its calls (the scaled reference call; the
#: transfer of its tensors comes on top): a hang of a slow problem's candidate still ends. The
#: limit of the reference's ``torch.compile``
#: (:data:`kerneljudge.check.reference.COMPILE_TIMEOUT_S`) is the same.
CAP_S = 600.0
#: Seconds per GiB a candidate's request adds for the tensors it moves (its inputs fetched
#: from the reference worker and sent to it, its outputs sent back and on to the reference
#: for the comparison): the judge sent 19_ReLU's 6 GiB of inputs to a reference worker in
#: 76 s on a busy H200 host (12.7 s per GiB, pickled through a socket); more than twice that.
TRANSFER_S_PER_GIB = 30.0
#: Least limit of a request of the reference (seconds): the fixed limit every request had
#: before limits were derived, kept for the reference's first run (lazy initialisation, a
#: device context, autotuning) where nothing has been measured yet.
REFERENCE_FLOOR_S = 120.0
#: Seconds per GiB of inputs (and weights) the reference's requests add: sending them
#: (:data:`TRANSFER_S_PER_GIB`), copying them to the device and running the float64 oracle
#: on them, at about twice the transfer's rate.
REFERENCE_S_PER_GIB = 60.0
#: Least limit of the candidate's import (seconds): importing Triton or a compiled extension
#: takes seconds on a quiet host and several times that on a loaded one.
LOAD_FLOOR_S = 60.0

_GIB = float(1 << 30)


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (nested lists, tuples and dict values; other leaves
    count 0)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    return 0


def meta_weight_bytes(problem: Problem, init_inputs: list[Any]) -> int:
    """Bytes of the state dict of ``problem``'s ``Model(*init_inputs)`` constructed on the
    ``meta`` device (no memory, no data); 0 when that construction raises."""
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = problem.module.Model(*init_inputs)
        return tensor_bytes(list(model.state_dict().values()))
    except Exception:  # noqa: BLE001 - problem code that needs real tensors: no estimate
        return 0


@dataclass(frozen=True)
class SetLimits:
    """The limits of one shape set's requests in one verdict (seconds).

    Attributes:
        run_s: limit of each request to the candidate's worker on this shape set (``setup``,
            a trial's ``run``, the timing stage's floor: :class:`kerneljudge.timing.BatchLimit`).
        reference_s: limit of each request to the reference's worker on this shape set.
        reference_call_s: the reference's measured call (the least supervisor wall time of its
            trials' runs on this shape set; 0 when none was measured).
        moved_bytes: bytes a trial's request moves: its inputs and its outputs.
        first_run_s: limit of the candidate's ``setup`` and first trial on this shape set:
            ``run_s``, at least :data:`FIRST_CALL_FLOOR_S` unless the limit is explicit.
    """

    run_s: float
    reference_s: float
    reference_call_s: float
    moved_bytes: int
    first_run_s: float = 0.0


@dataclass(frozen=True)
class RunLimits:
    """How the limits of a verdict's requests are derived (the module's docstring).

    Attributes:
        explicit_s: the configured ``run_timeout_s`` (None: derived); when given it is the
            limit of every candidate request, and the least limit of the reference's.
        floor_s, factor, cap_s, transfer_s_per_gib: :data:`FLOOR_S`, :data:`FACTOR`,
            :data:`CAP_S`, :data:`TRANSFER_S_PER_GIB`.
    """

    explicit_s: float | None = None
    floor_s: float = FLOOR_S
    factor: float = FACTOR
    cap_s: float = CAP_S
    transfer_s_per_gib: float = TRANSFER_S_PER_GIB

    @property
    def source(self) -> str:
        """``explicit`` (a configured ``run_timeout_s``) or ``derived``."""
        return "derived" if self.explicit_s is None else "explicit"

    def reference_s(self, nbytes: int) -> float:
        """Limit of a request of the reference that moves ``nbytes`` bytes of inputs and
        weights: :data:`REFERENCE_FLOOR_S` + :data:`REFERENCE_S_PER_GIB` per GiB, at least the
        explicit limit."""
        derived = REFERENCE_FLOOR_S + REFERENCE_S_PER_GIB * nbytes / _GIB
        return max(derived, self.explicit_s or 0.0)

    def run_s(self, reference_call_s: float, moved_bytes: int) -> float:
        """Limit of a candidate's request on a shape set whose reference call took
        ``reference_call_s`` seconds and whose trial moves ``moved_bytes`` bytes (inputs and
        outputs): the explicit limit if there is one, else
        ``max(floor_s, min(cap_s, factor x reference_call_s) + transfer_s_per_gib x GiB)``."""
        if self.explicit_s is not None:
            return self.explicit_s
        calls = min(self.cap_s, self.factor * reference_call_s)
        return max(self.floor_s, calls + self.transfer_s_per_gib * moved_bytes / _GIB)

    def load_s(self, sets: Iterable[SetLimits]) -> float:
        """Limit of the candidate's import: the explicit limit, else the largest run limit of
        ``sets`` and at least :data:`LOAD_FLOOR_S`."""
        if self.explicit_s is not None:
            return self.explicit_s
        return max([LOAD_FLOOR_S, *(s.run_s for s in sets)])

    def for_set(self, wall_s: Iterable[float], moved_bytes: int) -> SetLimits:
        """The limits of a shape set whose reference calls took ``wall_s`` seconds each (the
        least one is the reference's call: the others carry a first call's warm-up or a
        moment of load) and whose trials move at most ``moved_bytes`` bytes."""
        walls = [w for w in wall_s if w > 0]
        call = min(walls) if walls else 0.0
        run = self.run_s(call, moved_bytes)
        first = run if self.explicit_s is not None else max(run, FIRST_CALL_FLOOR_S)
        reference = max(run, self.reference_s(moved_bytes))
        return SetLimits(run, reference, call, moved_bytes, first)

    def record(self, sets: Mapping[str, SetLimits]) -> RequestLimits:
        """The verdict's record of the limits of ``sets`` (shape set -> its limits)."""
        return RequestLimits(
            source=self.source,
            load_s=self.load_s(sets.values()),
            run_s={name: s.run_s for name, s in sets.items()},
            reference_s={name: s.reference_s for name, s in sets.items()},
            reference_call_s={name: s.reference_call_s for name, s in sets.items()},
            floor_s=self.floor_s,
            cap_s=self.cap_s,
            factor=self.factor,
        )
