"""The trusted reference worker of one problem and shape set: fixed weights, reference runs,
the float64 oracle, and the eager and ``torch.compile`` baselines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kerneljudge.errors import ProblemError, WorkerError
from kerneljudge.problem import Problem
from kerneljudge.worker import CandidateFault, WorkerDied, WorkerProcess, WorkerTimeout

__all__ = ["ReferenceFailed", "ReferenceSession", "first_line"]


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


class ReferenceFailed(WorkerError):
    """The reference worker failed (died, hung, raised); its session is discarded.

    Attributes:
        had_answered: it had run the reference before (a ``run`` or later request answered,
            not only ``load_problem`` and ``setup``), so the problem itself works and the
            failure came from outside (a candidate running beside it). When false, the
            problem failed on its own: the judge reports a
            :class:`~kerneljudge.errors.ProblemError`.
    """

    def __init__(self, message: str, had_answered: bool) -> None:
        super().__init__(message)
        self.had_answered = had_answered


class ReferenceSession:
    """The trusted reference worker for one shape set: fixed weights, reference runs, baselines."""

    def __init__(
        self, problem: Problem, shape_set: str, device: str, weight_seed: int, threads: int
    ) -> None:
        """Draw the weights here from a fresh copy of ``problem`` (same text, own globals).

        Raises:
            ProblemError: the problem's ``get_init_inputs`` or ``Model`` raised here.
        """
        self.problem = problem.fresh()
        self.problem.use_shape_set(shape_set)
        self.shape_set = shape_set
        try:  # problem code, run here for the weights every worker gets
            self.init_inputs = self.problem.make_init_inputs(weight_seed)
            model = self.problem.make_model(weight_seed, self.init_inputs)
            self.state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}
        except Exception as exc:  # noqa: BLE001 - the problem file is user input
            raise ProblemError(
                f"{problem.path}: constructing Model (shape set {shape_set!r}) raised "
                f"{type(exc).__name__}: {first_line(str(exc))}"
            ) from None
        self._device, self._threads = device, threads
        self.worker = WorkerProcess("reference", device, threads=threads)
        self._ready = False
        self.failed = False
        self.answered = False
        self.compile_error: str | None = None
        self._compiled = False
        self.killed = False

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
            self.answered = self.answered or op not in ("load_problem", "setup")
        except (CandidateFault, WorkerDied, WorkerTimeout) as exc:
            self.failed = True
            self.worker.kill()
            detail = first_line(str(exc)) if isinstance(exc, CandidateFault) else str(exc)
            raise ReferenceFailed(
                f"the reference of {self.problem.name} failed on {op}: {detail}", self.answered
            ) from None
        return reply

    def _set_up(self, timeout_s: float) -> None:
        """Load the problem and its weights into a worker that has not had them."""
        if not self._ready:
            self._ready = True
            self.request(
                "load_problem", timeout_s, path=str(self.problem.path), shape_set=self.shape_set
            )
            self.request(
                "setup", timeout_s, init_inputs=self.init_inputs, state_dict=self.state_dict
            )

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
        baseline is lost. After :meth:`kill` nothing is replaced.

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
                self.worker = WorkerProcess("reference", self._device, threads=self._threads)
                self._ready, self.answered = False, False
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
