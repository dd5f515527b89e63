"""A candidate's request and the reference's comparison of its outputs, run at once over a pipe
of their own (:mod:`kerneljudge.worker.side`), so that the outputs go from the candidate's
worker straight to the reference worker instead of through the supervisor.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from kerneljudge.errors import WorkerError
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.faults import CandidateFault
from kerneljudge.worker.side import HandOverFailed, SidePipe

__all__ = [
    "THROUGH_HOST_ENV",
    "OutputsLost",
    "beside",
    "outputs_beside",
    "side_fields",
    "with_first_record",
]

#: With this set to ``1`` in the supervisor's environment, a candidate's outputs always go
#: through the host, never on the device (:func:`outputs_beside`).
THROUGH_HOST_ENV = "KERNELJUDGE_OUTPUTS_THROUGH_HOST"


class OutputsLost(CandidateFault):
    """The candidate's worker answered, but its outputs did not reach the reference worker
    whole (nothing sent, cut short, corrupt, too large or late). ``device_failed``: they were
    sent on the device and the reference worker's driver would not take them (worth one more
    request through the host: :func:`outputs_beside`)."""

    def __init__(self, why: str, device_failed: bool = False) -> None:
        super().__init__(f"the outputs did not reach the reference worker: {why}")
        self.device_failed = device_failed


def side_fields(token: str, timeout_s: float) -> dict[str, Any]:
    """The fields of a reference request that reads a candidate's outputs from the pipe
    ``token`` names, within ``timeout_s`` seconds (and at most twice the reference's outputs
    plus 1 MiB: :meth:`kerneljudge.worker.kept_trials.KeptTrials.op_compare`)."""
    return {"side": token, "side_timeout_s": timeout_s}


def beside(
    reference: WorkerProcess,
    candidate: WorkerProcess,
    ask_reference: Callable[[str], dict[str, Any]],
    ask_candidate: Callable[[str], dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(candidate's reply, reference's reply)`` of two requests made at once over one
    :class:`~kerneljudge.worker.side.SidePipe`: ``ask_reference(token)`` (on a thread of its
    own; it reads the outputs) and ``ask_candidate(token)`` (here; it writes them), each given
    the pipe's token as hex. The pipe is finished once the candidate's request returned or
    failed (a reference worker waiting for outputs that were never written then answers at
    once; one cut short, once the candidate's worker's end is closed, or at its own limit),
    then this waits for the reference's request.

    Raises:
        whatever ``ask_reference`` raised (a failure of the reference decides nothing about
        the candidate); else whatever ``ask_candidate`` raised (the reference's answer, a
        ``side_error``, is dropped then).
        OutputsLost: the candidate's end of the pipe could not be handed to its worker.
        WorkerError: the reference's end could not be handed to its worker.
    """
    box: dict[str, Any] = {}
    try:
        pipe = SidePipe(reference, candidate)
    except HandOverFailed as exc:
        if exc.role == "candidate":
            raise OutputsLost(str(exc)) from None
        raise WorkerError(str(exc)) from None
    with pipe:
        token = pipe.token.hex()

        def ask() -> None:
            try:
                box["reply"] = ask_reference(token)
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=ask, name="kerneljudge-compare", daemon=True)
        thread.start()
        try:
            got = ask_candidate(token)
        finally:
            pipe.finish()
            thread.join()
            if "error" in box:  # taken out: the box would hold it, its traceback the box
                raise box.pop("error")
    return got, box["reply"]


def outputs_beside(
    reference: WorkerProcess,
    candidate: WorkerProcess,
    op: str,
    run_s: float,
    fields: dict[str, Any],
    read: Callable[..., Any],
) -> tuple[dict[str, Any], Any]:
    """The candidate's request ``op`` (``fields``, within ``run_s`` seconds), whose outputs go
    to the reference worker on a pipe of their own, and ``read(side=...)``, the reference's
    request that reads them (``side``: :func:`side_fields` of the pipe, waiting at most ``run_s``),
    made at once (:func:`beside`): ``(the candidate's reply, what read returned)``, or the
    :class:`OutputsLost` it raised in place of the latter (the caller decides whether that
    counts: a candidate that ran nothing sent nothing). Outputs that the candidate's worker
    sent on the device and the reference worker's driver would not take are asked for once
    more, the candidate's request made again with ``side_host`` (through the host) and
    ``keep`` false (a trial's inputs are kept once); the reply returned then still carries what
    the first one recorded of the call (:func:`with_first_record`). With
    :data:`THROUGH_HOST_ENV` set to ``1`` every request says ``side_host`` (to measure one way
    against the other).

    Raises:
        as :func:`beside`.
    """

    def ask_reference(token: str) -> dict[str, Any]:
        try:
            return {"found": read(side=side_fields(token, run_s))}
        except OutputsLost as exc:
            return {"found": exc}

    def ask_candidate(token: str, **how: Any) -> dict[str, Any]:
        if os.environ.get(THROUGH_HOST_ENV) == "1":
            how["side_host"] = True
        return candidate.request(op, run_s, side=token, **{**fields, **how})

    got, answer = beside(reference, candidate, ask_reference, ask_candidate)
    found = answer["found"]
    if isinstance(found, OutputsLost) and found.device_failed:
        # The same request once more, through the host. A candidate could have made the driver
        # refuse (a descriptor of no such allocation): it gains nothing by the second call, whose
        # reply keeps what the first recorded.
        first = got
        through_host = functools.partial(ask_candidate, side_host=True, keep=False)
        got, answer = beside(reference, candidate, ask_reference, through_host)
        got, found = with_first_record(first, got), answer["found"]
    return got, found


def with_first_record(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """``second``, a reply to a request made again, with what ``first`` recorded of the same
    call added: the operators it ran (``ops``) and the inputs it changed in place
    (``modified_inputs``), each the sorted union of both lists, and ``aliases_input`` true
    when either says so. A field that is no list of strings (``ops``) or integers
    (``modified_inputs``) is kept as the first reply has it where that one is malformed, else
    as ``second`` has it, for the caller's checks to refuse."""
    merged = dict(second)
    for name, kind in (("ops", str), ("modified_inputs", int)):
        a, b = first.get(name), second.get(name)
        if a is None:
            continue
        if not (isinstance(a, list) and all(type(x) is kind for x in a)):
            merged[name] = a  # the first reply's malformed record, for the caller to refuse
            continue
        if isinstance(b, (list, type(None))) and all(type(x) is kind for x in b or []):
            merged[name] = sorted(set(a + (b or [])))
    if first.get("aliases_input") is True:
        merged["aliases_input"] = True
    return merged
