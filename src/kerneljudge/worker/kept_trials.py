"""The reference worker's kept trials: its handlers for what it keeps between requests.

A trial's inputs, reference outputs and float64 oracle stay in the reference worker, under the
supervisor's key (:meth:`kerneljudge.worker.runtime.Worker.op_run` with ``expect``); the
handlers here hand the inputs back, compare a candidate's outputs with the kept ones and drop
them. A mixin of :class:`kerneljudge.worker.runtime.Worker`, whose request table lists them with
its own handlers; another role's worker answers them with a harness error.

Imports only the standard library, torch and :mod:`kerneljudge.worker` modules at load;
:mod:`kerneljudge.check` when a comparison is asked for or a trial is kept on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.worker.calls import nbytes, trial_fields
from kerneljudge.worker.drawn import draw_inputs, fingerprint
from kerneljudge.worker.forward import to_cpu
from kerneljudge.worker.measure import flatten_tensors
from kerneljudge.worker.protocol import MAX_MESSAGE_BYTES
from kerneljudge.worker.side import recv_outputs
from kerneljudge.worker.stamps import KIND_TREE, output_digest

__all__ = [
    "KEEP_DEVICE_SHARE",
    "KEEP_FREE_SHARE",
    "KEEP_HOST_SHARE",
    "KeptTrials",
    "Redraw",
    "release",
]

#: The share of a GPU's memory the reference's kept outputs and oracles may take there (the
#: candidate shares the device: its inputs, outputs and workspace need the rest).
KEEP_DEVICE_SHARE = 0.25
#: The share of the GPU's free memory one kept copy may take.
KEEP_FREE_SHARE = 0.25
#: The share of the host's available memory (:func:`kerneljudge.check.memory.available_bytes`)
#: a CPU worker's kept trials may take before it says it has no room for another.
KEEP_HOST_SHARE = 0.25


class Redraw:
    """Held inputs drawn on the GPU, held as what redraws them: the seed and the draw's
    fingerprint (:func:`kerneljudge.worker.drawn.fingerprint`), not gigabytes copied to the host.
    """

    def __init__(self, seed: int, printed: str) -> None:
        self.seed = seed
        self.printed = printed


class KeptTrials:
    """The handlers ``held_inputs``, ``compare``, ``forget`` and ``weights`` (``op_<name>``).

    Attributes:
        role: ``"reference"`` or ``"candidate"``; only the reference keeps trials.
        device: the worker's ``torch.device`` (comparisons run there).
        expected: per key, the reference's ``{"outputs", "oracle"}`` of that trial (on the
            GPU or the host: :meth:`keep_copy`).
        held: per key, the trial's inputs as received (on the CPU), when asked to hold them;
            a :class:`Redraw` where they were drawn on the GPU.
        spares: tensors written over by later requests (dropped on ``forget``).
        inputs: the current request's inputs.
    """

    role: str
    device: Any
    expected: dict[str, dict[str, Any]]
    held: dict[str, Any]
    problem: Any
    spares: dict[str, list[Any]]
    inputs: list[Any]
    handoff: Any

    def _drop_spares(self) -> None:
        """Free the spares (the current inputs too, where they are the audit's spare), and on a
        GPU give the caching allocator's free blocks back to the device (the other worker
        shares it)."""
        if self.spares.get("audit") is self.inputs:
            self.inputs = []
        self.spares.clear()
        release(self.device)

    def keep_copy(self, value: Any) -> Any:
        """A detached copy of outputs the reference keeps for comparisons (a trial's outputs
        or float64 oracle): on this worker's GPU while every kept tensor there takes at most
        :data:`KEEP_DEVICE_SHARE` of the device's memory and this copy at most
        :data:`KEEP_FREE_SHARE` of what is free, so that comparisons read them where they
        run; else on the host (:func:`kerneljudge.worker.forward.to_cpu`), as on a CPU worker.

        Raises:
            Fault: as :func:`~kerneljudge.worker.forward.to_cpu`.
        """
        if getattr(self.device, "type", "cpu") != "cuda":
            return to_cpu(value)
        size = nbytes(flatten_tensors(value))
        free, total = torch.cuda.mem_get_info(self.device)
        kept, _ = self.kept_sizes()
        on_device = size <= KEEP_FREE_SHARE * free and kept + size <= KEEP_DEVICE_SHARE * total
        return to_cpu(value, keep_device=on_device)

    def hold(self, key: str, received: list[Any], seed: Any, on_device: bool) -> dict[str, Any]:
        """Hold a trial's inputs under ``key``: a :class:`Redraw` where they were drawn on the
        GPU from ``seed`` and a second draw there has the same fingerprint (a verifiable one);
        else as received, copied to the host. Returns the reply's ``input_fingerprint`` and
        ``drawn_on_device``."""
        printed = fingerprint(received)
        redraw = on_device and not printed.startswith("unverifiable:")
        if redraw:  # a draw that is not a function of the seed alone is held as it came
            again = draw_inputs(self.problem, int(seed), self.device)
            redraw = fingerprint(again) == printed
            del again
        self.held[key] = Redraw(int(seed), printed) if redraw else _on_host(received)
        return {"input_fingerprint": printed, "drawn_on_device": on_device}

    def held_inputs_of(self, key: Any) -> list[Any]:
        """The inputs held under ``key``: redrawn on the GPU where held as a :class:`Redraw`.

        Raises:
            RuntimeError: no such key, or a redraw whose fingerprint differs from the first
                draw's (a harness error: the problem's draw is not a function of its seed).
        """
        held = self._reference_only(self.held, key)
        if not isinstance(held, Redraw):
            return list(held)
        inputs = draw_inputs(self.problem, held.seed, self.device)
        if fingerprint(inputs) != held.printed:
            raise RuntimeError(
                f"the inputs of trial {key!r} drawn again differ from its first draw"
            )
        return inputs

    def kept_sizes(self) -> tuple[int, int]:
        """Bytes of the kept trials' tensors ``(on the GPU, on the host)``: outputs, oracles
        and held inputs."""
        tensors = flatten_tensors([list(entry.values()) for entry in self.expected.values()])
        tensors += flatten_tensors([h for h in self.held.values() if not isinstance(h, Redraw)])
        on_device = nbytes([t for t in tensors if t.device.type != "cpu"])
        return on_device, nbytes(tensors) - on_device

    def room_for_another(self, key: str, budget: int = 0) -> bool:
        """Whether another trial as large as the one kept under ``key`` would still fit: with a
        ``budget`` (bytes, > 0), all kept trials within it; else on a GPU, the trial kept there
        and the kept tensors there within :data:`KEEP_DEVICE_SHARE` of its memory; on a CPU,
        those on the host within :data:`KEEP_HOST_SHARE` of what it has available
        (:func:`kerneljudge.check.memory.available_bytes`; room where that is unknown). On a
        GPU the outputs and oracle count (inputs held on the host do not), and a copy must also
        take at most :data:`KEEP_FREE_SHARE` of what is free there, as :meth:`keep_copy` asks.
        The supervisor runs the trials after one that has no room only when they are compared."""
        kept = flatten_tensors(list(self.expected[key].values()))
        held = self.held.get(key)
        size = nbytes(kept)  # its outputs and oracle, and below its inputs held on the host
        held_bytes = nbytes(flatten_tensors(held)) if isinstance(held, list) else 0
        on_device, on_host = self.kept_sizes()
        if budget > 0:
            return on_device + on_host + size + held_bytes <= budget
        if getattr(self.device, "type", "cpu") == "cuda":
            if any(t.device.type == "cpu" for t in kept):  # spilled: the device had no room
                return False
            free, total = torch.cuda.mem_get_info(self.device)
            return size <= KEEP_FREE_SHARE * free and on_device + size <= KEEP_DEVICE_SHARE * total
        from kerneljudge.check.memory import available_bytes

        available = available_bytes()
        size += held_bytes
        return available is None or on_host + size <= KEEP_HOST_SHARE * (available + on_host)

    def _reference_only(self, table: dict[str, Any], key: Any) -> Any:
        """``table[str(key)]`` in the reference worker.

        Raises:
            RuntimeError: another role, or no such key (a harness error).
        """
        if self.role != "reference":
            raise RuntimeError("only the reference worker keeps trials")
        if str(key) not in table:
            raise RuntimeError(f"no trial kept under {key!r}")
        return table[str(key)]

    def op_held_inputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The inputs held under ``key`` (on the CPU: as received, or copied there from a GPU
        redraw, :meth:`held_inputs_of`), dropped here if ``forget``; with ``send`` false, only
        dropped."""
        reply: dict[str, Any] = {}
        if msg.get("send", True):
            reply["inputs"] = _on_host(self.held_inputs_of(msg["key"]))
        if msg.get("forget"):
            self._reference_only(self.held, msg["key"])
            del self.held[str(msg["key"])]
        return reply

    def op_weights(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``state_dict``: the reference model's state dict, its tensors on the CPU."""
        model = getattr(self, "model", None)
        if self.role != "reference" or model is None:
            raise RuntimeError("only a set-up reference worker has weights to send")
        return {"state_dict": {k: to_cpu(v) for k, v in model.state_dict().items()}}

    def op_compare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare ``outputs`` (a candidate's, relayed by the supervisor) with the reference's
        kept under ``key`` (:func:`kerneljudge.check.compare_outputs` with ``atol``, ``rtol``,
        ``mode`` and ``index``, computed on this worker's device); drops them if ``forget``.
        Returns ``trial``: the :class:`~kerneljudge.verdict.TrialResult` as a dict
        (:func:`trial_fields`), and with ``digest_kinds`` (one digest kind per output)
        ``digests``: each output's ``[kind, digest]`` (:meth:`_digests`).

        With ``side`` (a token's hex) instead of ``outputs``, the outputs are read from the pipe
        handed over under that token (:func:`kerneljudge.worker.side.recv_outputs`), within
        ``side_timeout_s`` seconds and twice the kept outputs' bytes plus 1 MiB (at most
        ``side_max_bytes`` where the request sets it), those sent on the device copied onto this
        worker's; when none came the reply is ``{"side_error": why, "side_device_failed": ...}``
        (True: they were sent on the device and the driver would not hand them over) and
        nothing is dropped. The reply then also says whether they were a list of
        plain tensors (``tensors``; only then are their ``digests`` computed), how many
        (``n_outputs``; -1 when they were not), and whether any came on the device
        (``on_device``)."""
        from kerneljudge.check import compare_outputs

        kept = self._reference_only(self.expected, msg["key"])
        outputs, extra = msg.get("outputs"), {}
        if msg.get("side"):
            limit = 2 * sum(t.numel() * t.element_size() for t in flatten_tensors(kept["outputs"]))
            limit = min(limit + (1 << 20), int(msg.get("side_max_bytes") or MAX_MESSAGE_BYTES))
            token, wait_s = bytes.fromhex(str(msg["side"])), float(msg["side_timeout_s"])
            outputs, why, failed = recv_outputs(self.handoff, token, wait_s, limit, self.device)
            if why:
                return {"side_error": why, "side_device_failed": failed}
            plain = isinstance(outputs, list) and all(type(t) is torch.Tensor for t in outputs)
            extra = {"tensors": plain, "n_outputs": len(outputs) if plain else -1}
            extra["on_device"] = any(t.is_cuda for t in flatten_tensors(outputs))
        if msg.get("forget"):
            del self.expected[str(msg["key"])]

        def compare(device: Any) -> Any:
            return compare_outputs(
                kept["outputs"],
                outputs,
                oracle=kept["oracle"],
                atol=float(msg["atol"]),
                rtol=float(msg["rtol"]),
                mode=str(msg["mode"]),
                index=int(msg.get("index", 0)),
                device=device,
            )

        reply: dict[str, Any] = {"trial": trial_fields(_on_device_or_host(self.device, compare))}
        if msg.get("digest_kinds") is not None and extra.get("tensors", True):
            kinds = msg["digest_kinds"]
            reply["digests"] = _on_device_or_host(
                self.device, lambda device: self._digests(outputs, kinds, device)
            )
        kept, outputs = {}, None  # a dropped trial's blocks go back to the device with the cache
        if msg.get("forget"):
            release(self.device)
        return {**reply, **extra}

    @staticmethod
    def _digests(outputs: Any, kinds: Any, device: Any) -> list[list[Any]]:
        """``[kind, digest bytes]`` of each of ``outputs`` (a list of tensors) by the kind of
        the same index in ``kinds`` (:func:`kerneljudge.worker.stamps.output_digest`); a tree
        digest is computed on ``device`` when given (the same value on any device). A list
        shorter than ``outputs`` gives fewer digests (the caller compares lengths)."""
        out: list[list[Any]] = []
        for t, kind in zip(outputs, kinds):
            if not isinstance(t, torch.Tensor):
                break
            t = t.to(device) if device is not None and int(kind) == KIND_TREE else t
            out.append(list(output_digest(t, int(kind))))
        return out

    def op_forget(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Drop the kept trials (outputs, oracle, inputs) of ``keys``, or all of them, and the
        spares."""
        keys = msg.get("keys")
        if keys is None:
            self.expected.clear()
            self.held.clear()
        for key in map(str, keys or ()):
            self.expected.pop(key, None)
            self.held.pop(key, None)
        self._drop_spares()  # last: the cached blocks given back include the trials'
        return {}


def release(device: Any) -> None:
    """On a GPU worker, give the caching allocator's free blocks back to the device (the other
    worker shares it: ``torch.cuda.empty_cache``); nothing on a CPU worker."""
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()


def _on_host(value: Any) -> Any:
    """``value`` with every tensor in it (in nested lists and tuples) on the host: a GPU
    tensor copied there, a CPU one as it is."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, list | tuple):
        return type(value)(_on_host(v) for v in value)
    return value


def _on_device_or_host(device: Any, work: Callable[[Any], Any]) -> Any:
    """``work(device)`` on a GPU worker, its memory given back to the device afterwards (the
    candidate shares it); ``work(None)`` (on the host) on a CPU worker, or when the GPU has no
    room for it (``torch.cuda.OutOfMemoryError``): the same result, slower."""
    if getattr(device, "type", "cpu") == "cpu":
        return work(None)
    try:
        try:
            return work(device)
        except torch.cuda.OutOfMemoryError:
            pass  # left here: its traceback holds the attempt's tensors on the device
        torch.cuda.empty_cache()
        return work(None)
    finally:
        torch.cuda.empty_cache()
