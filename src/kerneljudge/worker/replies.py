"""Typed replies of a worker, decoded and validated once, on the supervisor's side.

A worker's reply crosses the pipe as a dict. Those the judge decides from are decoded here into
frozen types before any rule reads them: :class:`RunReply` (a ``run`` request: one trial's
call) and :class:`TimeReply` (a ``time`` request: one timed batch). A reply of the wrong shape
from a candidate's worker, whose process candidate code controls, raises
:class:`MalformedReply`, a :class:`~kerneljudge.worker.faults.CandidateFault` with status
``rejected`` that the judge turns into a ``rejected`` verdict where it turns every candidate
failure into one (:class:`kerneljudge.judge.outcome.VerdictWriter`); the same from the trusted
reference worker is a bug of the harness, a :class:`~kerneljudge.errors.WorkerError`.

Values are checked for type here; what they mean (a time that is not positive, more time in
calls than on the wall) is the rules' business (:mod:`kerneljudge.timing.stage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerneljudge.errors import WorkerError
from kerneljudge.worker.faults import CandidateFault

__all__ = ["CaptureReply", "MalformedReply", "RunReply", "TimeReply"]


class MalformedReply(CandidateFault):
    """A candidate worker's reply is not of the shape its request asks for."""

    def __init__(self, op: str, why: str) -> None:
        super().__init__(f"the worker's reply to {op} is malformed: {why}", None, "rejected")


def _malformed(role: str, op: str, why: str) -> Exception:
    if role == "candidate":
        return MalformedReply(op, why)
    return WorkerError(f"the {role} worker's reply to {op} is malformed: {why}")


def _is_number(x: object) -> bool:
    return type(x) in (int, float)


@dataclass(frozen=True)
class RunReply:
    """A ``run`` request's reply, less its outputs (the caller hands those on unread).

    Attributes:
        ops: ATen operators the call ran (``record_ops`` requests; else empty).
        aliases_input: an output shares storage with an input.
        modified_inputs: indices of the inputs the call changed in place.
    """

    ops: tuple[str, ...]
    aliases_input: bool
    modified_inputs: tuple[int, ...]

    @classmethod
    def decode(cls, reply: Mapping[str, Any], role: str) -> RunReply:
        """The reply's fields, checked: ``outputs`` present (or ``side``: true, sent on a pipe
        of their own, :mod:`kerneljudge.worker.side`); ``ops`` a list of str,
        ``aliases_input`` a bool, ``modified_inputs`` a list of int, each optional.

        Raises:
            MalformedReply: a candidate worker's reply of another shape.
            WorkerError: the same from any other worker.
        """
        if "outputs" not in reply and reply.get("side") is not True:
            raise _malformed(role, "run", "no outputs")
        ops = reply.get("ops", [])
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise _malformed(role, "run", "ops is not a list of operator names")
        aliases = reply.get("aliases_input", False)
        if type(aliases) is not bool:
            raise _malformed(role, "run", "aliases_input is not a bool")
        modified = reply.get("modified_inputs", [])
        if not isinstance(modified, list) or not all(type(i) is int for i in modified):
            raise _malformed(role, "run", "modified_inputs is not a list of input indices")
        return cls(tuple(ops), aliases, tuple(modified))


@dataclass(frozen=True)
class TimeReply:
    """A ``time`` request's reply.

    Attributes:
        times_ms: one time per timed call (ms), as the worker reported them.
        n_sets: the input sets the worker rotated through (None where it did not say).
        between_cpu_ms: the worker's own CPU time between consecutive timed calls (ms; empty
            without a link).
    """

    times_ms: tuple[float, ...]
    n_sets: int | None
    between_cpu_ms: tuple[float, ...]

    @classmethod
    def decode(cls, reply: Mapping[str, Any], role: str) -> TimeReply:
        """The reply's fields, checked: ``times_ms`` a list of numbers; ``n_sets`` an int or
        absent; ``between_cpu_ms`` a list of numbers, absent or None.

        Raises:
            MalformedReply: a candidate worker's reply of another shape.
            WorkerError: the same from any other worker.
        """
        times = reply.get("times_ms")
        if not isinstance(times, list) or not all(_is_number(x) for x in times):
            raise _malformed(role, "time", "times_ms is not a list of numbers")
        n_sets = reply.get("n_sets")
        if n_sets is not None and type(n_sets) is not int:
            raise _malformed(role, "time", "n_sets is not an int")
        between = reply.get("between_cpu_ms") or []
        if not isinstance(between, list) or not all(_is_number(x) for x in between):
            raise _malformed(role, "time", "between_cpu_ms is not a list of numbers")
        return cls(tuple(float(x) for x in times), n_sets, tuple(float(x) for x in between))


@dataclass(frozen=True)
class CaptureReply:
    """A ``capture`` request's reply (:meth:`kerneljudge.worker.graphs.CapturedCalls.
    op_capture`).

    Attributes:
        captured: the forward was captured and its replay checked.
        reason: why not, one line (at most 500 characters; empty when captured).
        capture_s: the worker's seconds for it.
    """

    captured: bool
    reason: str
    capture_s: float

    @classmethod
    def decode(cls, reply: Mapping[str, Any], role: str) -> CaptureReply:
        """The reply's fields, checked: ``captured`` a bool, ``reason`` a str, ``capture_s`` a
        finite number >= 0.

        Raises:
            MalformedReply: a candidate worker's reply of another shape.
            WorkerError: the same from any other worker.
        """
        captured, reason, took = reply.get("captured"), reply.get("reason"), reply.get("capture_s")
        if type(captured) is not bool or not isinstance(reason, str) or not _is_number(took):
            raise _malformed(role, "capture", "captured, reason or capture_s is of another type")
        if not 0.0 <= float(took) < float("inf"):  # type: ignore[arg-type]
            raise _malformed(role, "capture", "capture_s is not a finite number of seconds")
        return cls(captured, " ".join(reason.split())[:500], float(took))  # type: ignore[arg-type]
