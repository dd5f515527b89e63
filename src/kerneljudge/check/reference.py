"""The trusted reference worker of one problem and shape set: fixed weights, reference runs,
the float64 oracle, the comparison of a candidate's outputs with them, and the eager and
``torch.compile`` baselines.

The weights and every trial's inputs but the first are drawn in the reference worker from their
seeds (:mod:`kerneljudge.worker.drawn`), and the candidate's worker draws its own from the same
seeds, checked against the reference's fingerprints; a trial's inputs, reference outputs and
float64 oracle stay in the reference worker, under a key (:class:`HeldTrial`). The supervisor
relays the candidate's outputs to be compared there (:meth:`ReferenceSession.compare`), and the
reference's inputs or weights only where a candidate's draw differed, so it holds at most one
trial's inputs or outputs at a time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kerneljudge.check.beside import OutputsLost
from kerneljudge.check.limits import meta_weight_bytes, tensor_bytes
from kerneljudge.errors import ProblemError, WorkerError, first_line
from kerneljudge.problem import Problem, probed_weight_bytes
from kerneljudge.verdict import Mismatch, TrialResult
from kerneljudge.worker import CandidateFault, WorkerDied, WorkerProcess, WorkerTimeout
from kerneljudge.worker.drawn import INPUTS_FAILED, WEIGHTS_FAILED

__all__ = ["HeldTrial", "ReferenceFailed", "ReferenceSession", "first_line"]


#: Limit of the reference's ``torch.compile`` (seconds; the run timeout when that is longer).
COMPILE_TIMEOUT_S = 600.0


class ReferenceFailed(WorkerError):
    """The reference worker failed (died, hung, raised); its session is discarded.

    Attributes:
        had_answered: it had run the reference before (a ``run`` or later request answered,
            not only ``load_problem`` and ``setup``), so the problem itself works and the
            failure came from outside (a candidate running beside it). When false, the problem
            failed on its own: the judge reports a :class:`~kerneljudge.errors.ProblemError`.
    """

    def __init__(self, message: str, had_answered: bool) -> None:
        super().__init__(message)
        self.had_answered = had_answered


@dataclass(frozen=True)
class HeldTrial:
    """A correctness trial whose inputs, outputs and oracle the reference worker holds.

    Attributes:
        key: its key in the reference worker.
        seed: the seed its inputs were drawn from (:meth:`Problem.make_inputs`).
        reply: the reference's reply to its run: ``aliases_input``, ``modified_inputs``,
            ``input_layout``/``output_layout`` (``[shape, dtype name]`` of each tensor),
            ``room`` (:meth:`kerneljudge.worker.kept_trials.KeptTrials.room_for_another`) and
            ``oracle_on_host`` (its float64 oracle was made on the host: no room on the GPU).
        wall_s: seconds its ``run`` request took on the supervisor's clock (the inputs sent,
            the call, the float64 oracle when asked, the reply; not the worker's start nor the
            loading of the problem and its weights); 0 when not measured.
        call_s: seconds of the reference's call itself, on its worker's clock (the device
            synchronised); 0 when not reported.
        deferred: not run yet: the reference worker had no room to keep it ahead (its reply
            is then ``{"oracle": bool}``), so it is run when the candidate's trial is compared.
    """

    key: str
    seed: int
    reply: dict[str, Any]
    wall_s: float = 0.0
    call_s: float = 0.0
    deferred: bool = False

    def input_stand_ins(self) -> list[torch.Tensor]:
        """Tensors on the ``meta`` device shaped as the trial's input tensors (no data)."""
        return _stand_ins(self.reply.get("input_layout", []))

    def output_stand_ins(self) -> list[torch.Tensor]:
        """Tensors on the ``meta`` device shaped as the reference's output tensors."""
        return _stand_ins(self.reply.get("output_layout", []))

    @property
    def input_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.input_stand_ins())

    @property
    def output_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.output_stand_ins())


def _stand_ins(layout: list[Any]) -> list[torch.Tensor]:
    return [torch.empty(s, dtype=getattr(torch, d), device="meta") for s, d in layout]


def _trial_result(fields: dict[str, Any]) -> TrialResult:
    """A :class:`TrialResult` from :func:`kerneljudge.worker.runtime.trial_fields`."""
    mismatches = tuple(
        Mismatch(index=tuple(int(i) for i in index), expected=expected, got=got)
        for index, expected, got in fields.pop("mismatches")
    )
    return TrialResult(**fields, mismatches=mismatches)


class ReferenceSession:
    """The trusted reference worker for one shape set: fixed weights, reference runs, baselines."""

    def __init__(
        self,
        problem: Problem,
        shape_set: str,
        device: str,
        weight_seed: int,
        threads: int,
        worker: WorkerProcess | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Draw the constructor's arguments here from a fresh copy of ``problem`` (same text,
        own globals); the weights are drawn from ``weight_seed`` by the workers. ``worker``: a
        reference worker of ``device`` with ``threads`` started earlier, that has loaded no
        problem (None: one is started here). ``env``: added to its workers' environment.

        Raises:
            ProblemError: the problem's ``get_init_inputs`` raised here.
        """
        self.problem = problem.fresh()
        self.problem.use_shape_set(shape_set)
        self.shape_set = shape_set
        self.weight_seed = weight_seed
        try:  # problem code, run here for the arguments every worker gets
            self.init_inputs = self.problem.make_init_inputs(weight_seed)
        except Exception as exc:  # noqa: BLE001 - the problem file is user input
            raise ProblemError(
                f"{problem.path}: get_init_inputs (shape set {shape_set!r}) raised "
                f"{type(exc).__name__}: {first_line(str(exc))}"
            ) from None
        #: The fingerprint of the weights the reference worker drew (None before), and where.
        self.weights: str | None = None
        self.weights_on = "cpu"
        probed = probed_weight_bytes(self.problem, shape_set)  # None: a bundled problem
        self._weight_bytes = (
            meta_weight_bytes(self.problem, self.init_inputs) if probed is None else probed
        )
        self._device, self._threads, self._env = device, threads, env
        self.worker = worker or WorkerProcess("reference", device, env, threads=threads)
        self._ready = False
        self.failed = False
        self.answered = False
        self.compile_error: str | None = None
        self._compiled = False
        self.killed = False
        #: Bytes of the largest trial inputs seen (None before the first trial).
        self._input_bytes: int | None = None
        #: The trials the worker holds, in the order run: key -> the fields of its ``run``
        #: request but the inputs (drawn again from the seed when a worker is replaced).
        self._held: dict[str, tuple[int, dict[str, Any]]] = {}
        #: Bytes the worker's kept trials may take before it has no room for another (0: its
        #: share of the device's memory, :mod:`kerneljudge.worker.kept_trials`).
        self.keep_bytes = 0
        #: How many of its audit runs (:meth:`run_timed_call`) had their oracle on the host.
        self.host_oracles = 0

    def request(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """A request the reference must answer; any failure is a harness error.

        Raises:
            ReferenceFailed: the worker raised, died or did not answer within ``timeout_s``
                seconds; it has been killed.
        """
        try:
            self._set_up(timeout_s)
            reply = self.worker.request(op, timeout_s, **fields)
            # Loading the problem and its weights does not run the reference: only a later
            # answer shows that the problem works on this device.
            self.answered = self.answered or op not in ("load_problem", "setup", "forget")
        except (CandidateFault, WorkerDied, WorkerTimeout) as exc:
            self.failed = True
            self.worker.kill()
            detail = first_line(str(exc)) if isinstance(exc, CandidateFault) else str(exc)
            raise ReferenceFailed(
                f"the reference of {self.problem.name} failed on {op}: {detail}", self.answered
            ) from None
        return reply

    @property
    def weight_bytes(self) -> int:
        """Bytes of the model's state dict: as the reference worker drew it once set up; before,
        as the problem's probe constructed it in this process
        (:func:`kerneljudge.problem.probed_weight_bytes`), else as constructed here on the
        ``meta`` device (0 where that fails)."""
        return self._weight_bytes

    def _set_up(self, timeout_s: float) -> None:
        """Load the problem into a worker that has not had it and draw its weights there.

        Raises:
            ReferenceFailed: as :meth:`request`.
            ProblemError: the problem's ``Model`` raised in the worker.
        """
        if not self._ready:
            self._ready = True
            self.request(
                "load_problem", timeout_s, path=str(self.problem.path), shape_set=self.shape_set
            )
            try:
                reply = self.request(
                    "setup", timeout_s, init_inputs=self.init_inputs, weight_seed=self.weight_seed
                )
            except WorkerError as exc:
                if WEIGHTS_FAILED not in str(exc):
                    raise
                self._ready = False  # no model there: the next request sets up again
                detail = str(exc).split(WEIGHTS_FAILED, 1)[1].lstrip(": ")
                raise ProblemError(
                    f"{self.problem.path}: constructing Model (shape set {self.shape_set!r}) "
                    f"raised {first_line(detail)}"
                ) from None
            self.weights, self.weights_on = str(reply["weights"]), str(reply["weights_on"])
            self._weight_bytes = int(reply["weight_bytes"])

    def _drew_otherwise(self, what: str) -> ReferenceFailed:
        """A replacement worker drew other ``what`` than the trials held: it is killed."""
        self.failed = True
        self.worker.kill()
        return ReferenceFailed(f"a new reference worker drew other {what} than the first did", True)

    def weight_fields(self, timeout_s: float) -> dict[str, Any]:
        """The fields of a candidate worker's ``setup`` that draw the weights there as the
        reference worker did (:func:`kerneljudge.worker.drawn.seeded_weights`): the seed, the
        reference's fingerprint and device, the problem file and shape set; the reference
        worker is set up first if it was not.

        Raises:
            ReferenceFailed, ProblemError: as :meth:`_set_up`.
        """
        self._set_up(timeout_s)
        return {
            "init_inputs": self.init_inputs,
            "weight_seed": self.weight_seed,
            "weights": self.weights,
            "weights_on": self.weights_on,
            "problem": str(self.problem.path),
            "shape_set": self.shape_set,
        }

    def state_dict(self, timeout_s: float) -> dict[str, torch.Tensor]:
        """The reference's weights, from its worker (on the CPU), for a candidate whose own
        draw differed.

        Raises:
            ReferenceFailed, ProblemError: as :meth:`_set_up`.
        """
        self._set_up(timeout_s)
        return dict(self.request("weights", timeout_s)["state_dict"])

    def run_trial(
        self, key: Any, seed: int, timeout_s: float, oracle: bool = True, per_gib_s: float = 0.0
    ) -> HeldTrial:
        """Run the reference on the inputs drawn from ``seed`` and hold the trial in the
        worker under ``key`` (inputs, outputs and, with ``oracle``, the float64 oracle); the
        run is timed on the supervisor's clock (:attr:`HeldTrial.wall_s`). The worker draws the
        inputs from ``seed`` (the same :meth:`~kerneljudge.problem.Problem.make_inputs`; on a
        GPU on the device, ``on_device``), so that no tensor crosses the channel for them; on a
        CPU the session's first trial's inputs are drawn here and sent, so that their size sets
        the limits of the later ones (the seed stays with the trusted reference worker).

        The limit of its requests is ``timeout_s`` plus ``per_gib_s`` seconds per GiB of the
        inputs (and of the weights, when this worker has not had them yet), so that a problem
        of gigabytes is not cut short by the time its tensors take to send.

        Raises:
            ReferenceFailed: as :meth:`request`.
            ProblemError: the problem's ``get_inputs`` raised in the worker.
        """
        drawn: dict[str, Any] = {"seed": seed, "on_device": True}  # on a GPU, drawn there
        nbytes = self._input_bytes
        if nbytes is None and str(self._device).startswith("cuda"):
            nbytes = 0  # the first trial, drawn there too: no tensor to send, the oracle fast
        elif nbytes is None:  # the first trial on a CPU: drawn here, its size sets the limits
            box = [self.problem.make_inputs(seed)]
            nbytes = tensor_bytes(box)
            # The inputs go out in the request alone: nothing here holds them while it runs.
            drawn = {"inputs": box.pop()}
        nbytes += 0 if self._ready else self.weight_bytes  # drawn in the worker, a GiB in seconds
        limit = timeout_s + per_gib_s * nbytes / float(1 << 30)
        self._set_up(limit)  # outside the timed run: loading the problem is not its call
        fields = {"expect": str(key), "hold_inputs": True, "oracle": oracle}
        fields["keep_bytes"] = self.keep_bytes
        started = time.monotonic()
        try:
            reply = self.request("run", limit, **drawn, **fields)
        except WorkerError as exc:
            if "seed" not in drawn or INPUTS_FAILED not in str(exc):
                raise
            detail = str(exc).split(INPUTS_FAILED, 1)[1].lstrip(": ")
            raise ProblemError(
                f"{self.problem.path}: get_inputs (shape set {self.shape_set!r}) raised "
                f"{first_line(detail)}"
            ) from None
        wall_s = time.monotonic() - started
        if "seed" in drawn:  # drawn in the worker: a replay draws them the same way, checked
            on_device, printed = bool(reply.get("drawn_on_device")), reply.get("input_fingerprint")
            fields = {**fields, "on_device": on_device, "fingerprint": printed}
        self._held[str(key)] = (seed, fields)
        kept = ("aliases_input", "modified_inputs", "input_layout", "output_layout",
                "input_fingerprint", "drawn_on_device", "room", "oracle_on_host")  # fmt: skip
        call_s = reply.get("call_s")
        call_s = float(call_s) if isinstance(call_s, int | float) else 0.0
        fields_kept = {k: reply[k] for k in kept if k in reply}
        held = HeldTrial(str(key), seed, fields_kept, wall_s, call_s)
        self._input_bytes = max(self._input_bytes or 0, held.input_bytes)
        return held

    def held_inputs(self, key: str, timeout_s: float, forget: bool = False) -> list[Any]:
        """The inputs of the trial held under ``key`` (on the CPU, as the reference got them);
        with ``forget``, the worker drops them.

        Raises:
            ReferenceFailed: as :meth:`request`.
        """
        return list(self.request("held_inputs", timeout_s, key=key, forget=forget)["inputs"])

    def forget_inputs(self, key: str, timeout_s: float) -> None:
        """The worker drops the inputs held under ``key``, sending nothing.

        Raises:
            ReferenceFailed: as :meth:`request`.
        """
        self.request("held_inputs", timeout_s, key=key, forget=True, send=False)

    def run_timed_call(
        self, key: str, seed: int, roll: bool, timeout_s: float, oracle: bool
    ) -> None:
        """Run the reference on the inputs a timed call made from the trial held under
        ``key`` with ``seed`` (:func:`kerneljudge.worker.measure.perturb`, built in the worker
        from the held inputs) and hold its outputs under the key ``"audit"``; the worker does
        not keep these inputs as a timed input set. Counts :attr:`host_oracles`.

        Raises:
            ReferenceFailed: as :meth:`request`.
        """
        reply = self.request(
            "run",
            timeout_s,
            from_held=key,
            perturb=seed,
            roll=roll,
            oracle=oracle,
            keep=False,
            expect="audit",
        )
        self.host_oracles += bool(reply.get("oracle_on_host"))

    def compare(
        self,
        key: str,
        outputs: Any,
        timeout_s: float,
        *,
        atol: float,
        rtol: float,
        mode: str,
        index: int = 0,
        forget: bool = True,
        side: dict[str, Any] | None = None,
    ) -> TrialResult:
        """A candidate's ``outputs`` compared with the reference's held under ``key``, in the
        reference worker (:func:`kerneljudge.check.compare_outputs`, same arguments); with
        ``forget`` the worker then drops that trial's outputs and oracle. With ``side``
        (:func:`kerneljudge.check.beside.side_fields`; ``outputs`` None) the worker reads them
        from the candidate's pipe, and the limit grows by the pipe's wait.

        Raises:
            ReferenceFailed: as :meth:`request`.
            OutputsLost: with ``side``, no outputs came (nothing is dropped then).
        """
        reply = self._compare_request(
            outputs, timeout_s, side, key=key, atol=atol, rtol=rtol, mode=mode, index=index,
            forget=forget,
        )  # fmt: skip
        return _trial_result(dict(reply["trial"]))

    def audit(
        self,
        outputs: list[Any] | None,
        kinds: list[int],
        timeout_s: float,
        *,
        atol: float,
        rtol: float,
        mode: str,
        side: dict[str, Any] | None = None,
    ) -> tuple[TrialResult, list[tuple[int, bytes]], int]:
        """:meth:`compare` of an audited timed call's ``outputs`` with the reference's held
        under ``"audit"``, and the digests of those outputs by ``kinds`` (one per output, as
        the candidate's worker committed them), both computed in the reference worker (a tree
        digest on its device): ``(result, [(kind, digest), ...], n)``, ``n`` the number of
        outputs the reference worker received (-1: not a list of plain tensors; with
        ``outputs`` given, their number). ``side`` as for :meth:`compare`.

        Raises:
            ReferenceFailed: as :meth:`request`.
            OutputsLost: with ``side``, no outputs came.
        """
        reply = self._compare_request(
            outputs, timeout_s, side, key="audit", atol=atol, rtol=rtol, mode=mode, forget=True,
            digest_kinds=list(kinds),
        )  # fmt: skip
        digests = [(int(k), bytes(d)) for k, d in reply.get("digests") or ()]
        n = reply.get("n_outputs", len(outputs) if outputs is not None else -1)
        return _trial_result(dict(reply["trial"])), digests, n if type(n) is int else -1

    def _compare_request(
        self, outputs: Any, timeout_s: float, side: dict[str, Any] | None, **fields: Any
    ) -> dict[str, Any]:
        """The worker's ``compare`` of ``outputs``, or of those read from the pipe ``side``
        names (the limit then grows by the pipe's wait); raises OutputsLost when none came."""
        given: dict[str, Any] = {"outputs": outputs} if side is None else dict(side)
        limit_s = timeout_s + float(given.get("side_timeout_s", 0.0))
        reply = self.request("compare", limit_s, **fields, **given)
        if "side_error" in reply:
            raise OutputsLost(str(reply["side_error"]), bool(reply.get("side_device_failed")))
        return reply

    def forget(self, timeout_s: float) -> None:
        """Drop every trial the worker holds (a worker not started yet holds none).

        Raises:
            ReferenceFailed: as :meth:`request`.
        """
        self._held.clear()
        if self._ready:
            self.request("forget", timeout_s)

    def ensure_compiled(
        self,
        timeout_s: float,
        replay: Sequence[list[Any]] = (),
        replay_timeout_s: float = 120.0,
    ) -> bool:
        """torch.compile the reference once; False (and ``compile_error``) if that fails.

        A compile that raises leaves the worker as it was. One that does not finish within
        ``timeout_s`` seconds (dynamo tracing a long Python loop can take many minutes), or
        that ends the worker, gets a fresh reference worker in its place, which runs the input
        sets ``replay`` (the trials run so far, each within ``replay_timeout_s``) to keep them
        for the timed loop, so that the eager reference goes on and only the ``compile``
        baseline is lost; the trials it held (:meth:`run_trial`) are run again first, from
        their seeds, so it holds them too. After :meth:`kill` nothing is replaced. The judge
        calls it while it prepares the reference, before a candidate is set up: weights that
        the replacement draws otherwise (an unseeded constructor) reach every later candidate.

        Raises:
            ReferenceFailed: the replacement worker failed too (``had_answered`` false).
        """
        if self._compiled or self.compile_error is not None:
            return self._compiled
        try:
            self._set_up(timeout_s)
            self.worker.request("compile", timeout_s)
            self._compiled = True
        except (CandidateFault, WorkerTimeout, WorkerDied) as exc:
            self.compile_error = first_line(str(exc))
            if not self.worker.alive() and not self.killed:
                self.worker.close()
                self.worker = WorkerProcess("reference", self._device, self._env, self._threads)
                self._ready, self.answered = False, False
                for seed, fields in list(self._held.values()):
                    if self.killed:
                        self.worker.kill()
                    # The trial's inputs again: drawn where they were drawn, or sent.
                    drawn = (
                        {"seed": seed}
                        if "on_device" in fields
                        else {"inputs": self.problem.make_inputs(seed)}
                    )
                    again = self.request("run", replay_timeout_s, **drawn, **fields)
                    if "seed" in drawn and again.get("input_fingerprint") != fields["fingerprint"]:
                        raise self._drew_otherwise("inputs") from None
                for inputs in replay:
                    if self.killed:  # killed meanwhile: the next request fails at once
                        self.worker.kill()
                    self.request("run", replay_timeout_s, inputs=inputs)
        return self._compiled

    def kill(self) -> None:
        """Kill the worker at once (a request waiting on it fails); it is not replaced."""
        self.killed = True
        self.worker.kill()

    def close(self) -> None:
        self.worker.close()
