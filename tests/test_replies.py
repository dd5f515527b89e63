"""Worker replies are decoded once into frozen types; a malformed one from a candidate's worker
is a rejection, from the reference's a harness error."""

from __future__ import annotations

import dataclasses

import pytest

from kerneljudge.check.trials import input_effect_violation
from kerneljudge.errors import WorkerError
from kerneljudge.worker.faults import CandidateFault
from kerneljudge.worker.replies import MalformedReply, RunReply, TimeReply


def test_a_run_reply_is_decoded_into_a_frozen_record() -> None:
    run = RunReply.decode(
        {"outputs": [1], "ops": ["aten::mm"], "aliases_input": True, "modified_inputs": [1]},
        "candidate",
    )
    assert run == RunReply(("aten::mm",), True, (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.ops = ()  # type: ignore[misc]
    # Optional fields take their defaults; the outputs are not kept.
    assert RunReply.decode({"outputs": None}, "candidate") == RunReply((), False, ())


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"outputs": [], "ops": None},
        {"outputs": [], "ops": [3]},
        {"outputs": [], "aliases_input": 1},
        {"outputs": [], "modified_inputs": "0"},
        {"outputs": [], "modified_inputs": [True]},
    ],
)
def test_a_malformed_run_reply_of_a_candidate_is_a_rejection(reply: dict) -> None:
    with pytest.raises(MalformedReply) as caught:
        RunReply.decode(reply, "candidate")
    assert isinstance(caught.value, CandidateFault) and caught.value.status == "rejected"
    assert "reply to run is malformed" in str(caught.value)
    with pytest.raises(WorkerError, match="reference worker's reply to run is malformed"):
        RunReply.decode(reply, "reference")


def test_a_time_reply_is_decoded_and_checked_for_type_only() -> None:
    timed = TimeReply.decode(
        {"times_ms": [0.5, 2], "n_sets": 3, "between_cpu_ms": [0.1]}, "candidate"
    )
    assert timed == TimeReply((0.5, 2.0), 3, (0.1,))
    # Values are the rules' business: a negative time decodes (the timing stage rejects it).
    assert TimeReply.decode({"times_ms": [-1.0], "between_cpu_ms": None}, "candidate") == (
        TimeReply((-1.0,), None, ())
    )


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"times_ms": "1.0"},
        {"times_ms": [1.0, None]},
        {"times_ms": [True]},
        {"times_ms": [1.0], "n_sets": 2.0},
        {"times_ms": [1.0], "between_cpu_ms": ["x"]},
    ],
)
def test_a_malformed_time_reply_of_a_candidate_is_a_rejection(reply: dict) -> None:
    with pytest.raises(MalformedReply, match="reply to time is malformed"):
        TimeReply.decode(reply, "candidate")
    with pytest.raises(WorkerError):
        TimeReply.decode(reply, "reference")


def test_input_effects_are_judged_against_the_reference_s_own() -> None:
    viewed = RunReply((), True, ())
    changed = RunReply((), False, (1,))
    assert input_effect_violation({}, viewed) == "forward returned a view of one of its inputs"
    assert input_effect_violation({"aliases_input": True}, viewed) == ""
    assert input_effect_violation({}, changed) == "forward changed its input 1 in place"
    assert input_effect_violation({"modified_inputs": [1]}, changed) == ""
