"""The trial loop of a verdict: the candidate runs each prepared trial's inputs in its worker,
its treatment of its inputs and the operators it called are checked, and its outputs are
compared by the trusted reference worker that holds the trial's reference outputs and oracle.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kerneljudge.candidate.policy import forbidden_ops_used, ops_reason, requires_custom_kernel
from kerneljudge.check.beside import OutputsLost, outputs_beside
from kerneljudge.check.limits import SetLimits
from kerneljudge.check.reference import HeldTrial, ReferenceFailed, ReferenceSession
from kerneljudge.verdict import CheckResult, TrialResult
from kerneljudge.worker import CandidateFault, WorkerProcess
from kerneljudge.worker.replies import MalformedReply, RunReply

__all__ = ["TrialRejected", "Trials", "input_effect_violation", "run_trials", "set_up_candidate"]


class TrialRejected(Exception):
    """A trial showed a cheat that no comparison is needed for; the message is the one-line
    reason (``forward changed its input x in place``, a forbidden operator)."""


@dataclass(frozen=True)
class Trials:
    """The trials' outcome.

    Attributes:
        check: every trial's result, the rule and its tolerances.
        sessions: shape set -> the reference session its trials were checked against.
    """

    check: CheckResult
    sessions: Mapping[str, ReferenceSession]

    def failure(self) -> str:
        """``"k/n trials passed; trial i: why"`` for the first failed trial ("" if none)."""
        bad = next((t for t in self.check.trials if not t.passed), None)
        if bad is None:
            return ""
        return (
            f"{self.check.n_passed}/{len(self.check.trials)} trials passed; "
            f"trial {bad.index}: {bad.reason}"
        )


def run_trials(
    worker: WorkerProcess,
    prepared: Mapping[str, list[HeldTrial]],
    session: Callable[[str], ReferenceSession],
    *,
    limits: Mapping[str, SetLimits],
    atol: float,
    rtol: float,
    mode: str,
    policy: Any,
    kept_set: str | None,
    done: list[TrialResult],
    say: Callable[[str], None],
) -> Trials:
    """Run every prepared trial in the candidate's worker, shape set by shape set.

    Per shape set the worker gets the reference's ``init_inputs`` and weights
    (:func:`set_up_candidate`); per trial, it draws the inputs from the trial's seed as the
    reference worker did, or, where its draw differs, gets the ones the reference worker holds
    (relayed one trial at a time), and its reply is checked against the reference's own on the
    same inputs (:func:`input_effect_violation`), against the problem's operator policy, then
    its outputs are compared in the reference worker (:meth:`ReferenceSession.compare`,
    ``mode`` with ``atol``/``rtol``).

    Args:
        worker: the candidate's worker, its candidate loaded.
        prepared: shape set -> its held trials (:meth:`ReferenceSide.prepare`); a deferred one
            (:attr:`HeldTrial.deferred`) is run by the reference right before the candidate's,
            and replaced in the list by the trial it holds then.
        session: the reference session of a shape set.
        limits: shape set -> the limits of its requests: ``run_s`` for the candidate's,
            ``reference_s`` for the reference's (:class:`kerneljudge.check.limits.SetLimits`).
        policy: the problem's custom-kernel policy (:mod:`kerneljudge.candidate.policy`).
        kept_set: the shape set whose inputs stay in the reference worker for the timing
            audit (None: none).
        done: each trial's result is appended to it as it is made, so that whoever handles a
            fault sees the trials before it.
        say: called with ``"trial i/n"`` before each trial.

    Returns:
        The trials' :class:`Trials`.

    Raises:
        TrialRejected: the candidate changed or aliased its inputs, or called a forbidden op.
        CandidateFault, WorkerDied, WorkerTimeout: the candidate failed.
        ReferenceFailed: the reference worker failed meanwhile (a deferred trial's run too).
        ProblemError: the problem's ``get_inputs`` raised on a deferred trial's seed.
    """
    record_ops = requires_custom_kernel(policy)
    total = sum(map(len, prepared.values()))
    sessions: dict[str, ReferenceSession] = {}
    for shape_set, held_trials in prepared.items():
        ref = sessions[shape_set] = session(shape_set)
        run_s, ref_s = limits[shape_set].run_s, limits[shape_set].reference_s
        first_s = max(run_s, limits[shape_set].first_run_s)  # __init__ may compile too
        drawn = set_up_candidate(worker, ref, first_s, ref_s)
        forget = shape_set != kept_set
        for i, held in enumerate(held_trials):
            say(f"trial {len(done) + 1}/{total}")
            if held.deferred:  # the reference worker had no room to keep it ahead: run now
                held = _run_deferred(ref, held, ref_s, len(done) + 1)
                held_trials[i] = held  # as if prepared so: the timing reads its layouts
            limit_s, got, trial = first_s if i == 0 else run_s, None, None
            compare = {"atol": atol, "rtol": rtol, "mode": mode, "index": len(done)}
            if drawn and held.reply.get("input_fingerprint"):
                # The candidate's worker draws the inputs from the trial's seed, as the
                # reference's did, and runs them only if their fingerprints match.
                fields = {
                    "seed": held.seed,
                    "fingerprint": held.reply["input_fingerprint"],
                    "on_device": bool(held.reply.get("drawn_on_device")),
                    "record_ops": record_ops,
                }
                got, trial = run_compared(worker, ref, held.key, (limit_s, ref_s), fields, compare)
                if trial is None:
                    drawn, got = False, None
                elif forget:
                    ref.forget_inputs(held.key, ref_s)
            if got is None:  # the reference's inputs, relayed where they fit
                if worker.reply_limit_bytes and held.input_bytes >= worker.reply_limit_bytes:
                    raise CandidateFault(
                        f"its worker's draw of the inputs differs from the reference's, and "
                        f"sending it the reference's ({held.input_bytes / (1 << 20):.0f} MiB) "
                        f"needs more memory than the judging process has"
                    )
                inputs = ref.held_inputs(held.key, ref_s, forget=forget)
                fields = {"inputs": inputs, "record_ops": record_ops}
                got, trial = run_compared(worker, ref, held.key, (limit_s, ref_s), fields, compare)
                del inputs, fields
            run = RunReply.decode(got, worker.role)
            effect = input_effect_violation(held.reply, run)
            if effect:
                raise TrialRejected(effect)
            used = forbidden_ops_used(list(run.ops), policy)
            if record_ops and used:
                raise TrialRejected(ops_reason(used))
            if trial is None:
                raise MalformedReply("run", "it answered that it drew no inputs, unasked")
            done.append(dataclasses.replace(trial, shape_set=shape_set))
    check = CheckResult(
        passed=all(t.passed for t in done), trials=tuple(done), mode=mode, atol=atol, rtol=rtol
    )
    return Trials(check, sessions)


def _run_deferred(ref: ReferenceSession, held: HeldTrial, ref_s: float, number: int) -> HeldTrial:
    """The reference's run of a deferred trial (``number``: its place among the verdict's).

    Raises:
        ReferenceFailed: that run failed. The candidate's worker, waiting for its next request,
            had run beside the reference (it may hold the device's memory or have work still
            running), so the failure counts as one while it was judged
            (:meth:`kerneljudge.judge.outcome.VerdictWriter.failure`); the message names the
            trial.
    """
    try:
        return ref.run_trial(held.key, held.seed, ref_s, bool(held.reply.get("oracle")))
    except ReferenceFailed as exc:
        raise ReferenceFailed(
            f"{exc} (trial {number}, deferred for want of room to keep it ahead)", exc.had_answered
        ) from None


def run_compared(
    worker: WorkerProcess,
    ref: ReferenceSession,
    key: str,
    limits_s: tuple[float, float],
    fields: dict[str, Any],
    compare: dict[str, Any],
) -> tuple[dict[str, Any], TrialResult | None]:
    """The candidate's ``run`` of ``fields`` and the reference worker's comparison of its
    outputs with the trial held under ``key`` (:meth:`ReferenceSession.compare` with
    ``compare``'s keywords), made at once over a pipe of their own
    (:func:`kerneljudge.check.beside.outputs_beside`): ``(the run's reply, the trial's
    result)``; the result is None when the candidate's worker did not run (``{"drawn": False}``).
    ``limits_s``: the candidate's and the reference's request limits (seconds).

    Raises:
        OutputsLost: the run answered but its outputs did not reach the reference worker.
        CandidateFault, WorkerDied, WorkerTimeout: the candidate failed.
        ReferenceFailed: the reference worker failed.
    """
    run_s, ref_s = limits_s
    got, found = outputs_beside(
        ref.worker,
        worker,
        "run",
        run_s,
        fields,
        functools.partial(ref.compare, key, None, ref_s, **compare),
    )
    if got.get("drawn") is False:
        if not isinstance(found, OutputsLost):  # it ran nothing, yet outputs came (and went)
            raise MalformedReply("run", "it answered that it drew no inputs, and sent outputs")
        return got, None
    if isinstance(found, OutputsLost):
        raise found
    return got, found


def set_up_candidate(
    worker: WorkerProcess, ref: ReferenceSession, timeout_s: float, reference_s: float
) -> bool:
    """Construct ``ModelNew`` in the candidate's worker with the reference's weights (its
    ``setup``, within ``timeout_s``): drawn there from their seed when its draw's fingerprint
    is the reference worker's (:meth:`ReferenceSession.weight_fields`), else sent from the
    reference worker (:meth:`ReferenceSession.state_dict`, within ``reference_s``). Returns
    whether they were drawn there: only then has that worker the problem to draw inputs from.

    Raises:
        CandidateFault, WorkerDied, WorkerTimeout: the candidate failed.
        ReferenceFailed, ProblemError: the reference worker failed meanwhile.
    """
    fields = ref.weight_fields(reference_s)
    if worker.request("setup", timeout_s, **fields).get("drawn") is not False:
        return True
    state = ref.state_dict(reference_s)
    worker.request("setup", timeout_s, init_inputs=ref.init_inputs, state_dict=state)
    return False


def input_effect_violation(reference: dict[str, Any], candidate: RunReply) -> str:
    """Why the candidate's treatment of its inputs is a cheat, if it is ("" if not; the
    reference's own behaviour, from its trusted worker's reply, is allowed: a reference that
    returns a view may be matched by one)."""
    if candidate.aliases_input and not reference.get("aliases_input"):
        return "forward returned a view of one of its inputs"
    changed = sorted(set(candidate.modified_inputs) - set(reference.get("modified_inputs", [])))
    if changed:
        return f"forward changed its input {changed[0]} in place"
    return ""
