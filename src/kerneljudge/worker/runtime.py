"""The worker process: runs either the trusted reference or one candidate, on request.

Started by :class:`kerneljudge.worker.process.WorkerProcess` as
``python -m kerneljudge.worker --role {reference,candidate} --device DEV --read-fd R --write-fd W``.
It answers one request at a time (see the handlers below) and exits on ``exit`` or when the
supervisor's pipe closes. A candidate worker serves exactly one candidate and is then discarded.

The handlers are :class:`Worker`'s ``op_<name>`` methods, with its mixins' (the reference's
kept trials, :mod:`~kerneljudge.worker.kept_trials`; graph captures, :mod:`~kerneljudge.worker.
graphs`). The float64 oracle, operator recorder and input classifier are in :mod:`~kerneljudge.
worker.forward`; confinement, tracebacks and the rest in :mod:`kerneljudge.worker.calls`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.worker import measure
from kerneljudge.worker.calls import (
    Confined,
    align_state_dict,
    call_copies,
    candidate_lineno,
    candidate_traceback,
    check_cpu_copyable,
    input_effects,
    layout,
    nbytes,
    profile_rows,
    trial_fields,
)
from kerneljudge.worker.drawn import candidate_model, inputs_from_seed, seeded_weights
from kerneljudge.worker.environment import jit_cache_folders
from kerneljudge.worker.forward import (
    Fault,
    OpRecorder,
    as_sent,
    float64_oracle,
    nudgeable,
    to_cpu,
    to_device,
)
from kerneljudge.worker.graphs import CapturedCalls
from kerneljudge.worker.kept_trials import KeptTrials, release
from kerneljudge.worker.perturbation import Plan
from kerneljudge.worker.protocol import Channel
from kerneljudge.worker.sandbox import (
    Sandbox,
    limit_output,
    set_subreaper,
    set_undumpable,
    thread_idents,
)
from kerneljudge.worker.serving import serve
from kerneljudge.worker.side import outputs_reply
from kerneljudge.worker.torchlog import drop_no_cuda_runtime_notice
from kerneljudge.worker.warming import warm_device

__all__ = [
    "MAX_TIMING_SETS",
    "SETS_DEVICE_SHARE",
    "Fault",
    "Worker",
    "align_state_dict",
    "main",
    "serve",
    "trial_fields",
]

# Captured before any candidate code runs: a candidate that patches these names in torch
# cannot change how the worker synchronises or how many threads it runs once pinned.
_synchronize = torch.cuda.synchronize
_set_num_threads = torch.set_num_threads
# The timed loop and the request handlers are bound here, before candidate code runs, so that
# patching ``measure.time_calls`` or the ``Worker`` class afterwards does not reach them.
_time_calls = measure.time_calls
#: Input sets kept for the timed loop (the latest trials'), each timed call uses one in turn.
MAX_TIMING_SETS = 4
#: The share of a GPU's memory the kept input sets may take together (always at least the
#: latest): both workers keep them, beside the reference's kept trials and the candidate's
#: workspace, so a problem with inputs of gigabytes times its calls on fewer sets.
SETS_DEVICE_SHARE = 1 / 16


class Worker(KeptTrials, CapturedCalls):
    """State of one worker process and its request handlers (``op_<name>``)."""

    def __init__(
        self, role: str, device: torch.device, stamp_sock: socket.socket | None = None
    ) -> None:
        self.role = role
        self.stamp_sock = stamp_sock
        self.handoff: socket.socket | None = None  # pipes handed over (kerneljudge.worker.side)
        self.device = device
        self.model: torch.nn.Module | None = None
        self.compiled: Callable[..., Any] | None = None
        self.model_cls: type | None = None
        self.problem: Any = None
        self.source_path: str | None = None
        self.inputs: list[Any] = []
        self.sets: list[list[Any]] = []  # the kept input sets of the timed loop
        self.nudgeable: list[list[Plan | None]] = []  # per kept set, per input (perturb's)
        self.snapshots: dict[int, Any] = {}  # the timed calls' kept outputs, by audit slot
        self.graphs = {}  # captured forwards by target (kerneljudge.worker.graphs)
        #: The reference's side of the trials, by the supervisor's key: outputs and float64
        #: oracle (``{"outputs", "oracle"}``) and, when asked, the inputs as received.
        self.expected: dict[str, dict[str, Any]] = {}
        self.held: dict[str, list[Any]] = {}
        self.poison_bytes = 0
        self.flush: torch.Tensor | None = None
        #: A CPU worker's tensors written over by its next audited call's inputs and float64
        #: oracle (perturb's and to_double's ``into``); dropped when timing starts and on forget.
        self.spares: dict[str, list[Any]] = {}
        self.sandbox: Sandbox | None = None
        if role == "candidate":
            self.sandbox = Sandbox([os.getcwd(), os.environ.get("TMPDIR", os.getcwd())])
            for folder in jit_cache_folders(os.environ, cuda=False):
                self.sandbox.allow_writes_to(folder)
            self.sandbox.install()

    def _confined(self) -> Confined:
        return Confined(self)

    def _check_output(self, out: Any) -> None:
        """Outputs must be plain tensors (no subclass that computes later)."""
        for t in measure.flatten_tensors(out):
            if type(t) is not torch.Tensor:
                raise Fault(
                    f"forward returned a {type(t).__name__}, not a plain torch.Tensor",
                    status="rejected",
                )

    def op_load_candidate(self, msg: dict[str, Any]) -> dict[str, Any]:
        path = str(msg["path"])
        self.source_path = path
        os.environ.update({str(k): str(v) for k, v in dict(msg.get("env", {})).items()})
        if self.sandbox is not None and os.environ.get("TORCH_EXTENSIONS_DIR"):
            self.sandbox.allow_writes_to(os.environ["TORCH_EXTENSIONS_DIR"])
        spec = importlib.util.spec_from_file_location("candidate_module", path)
        if spec is None or spec.loader is None:
            raise Fault(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["candidate_module"] = module
        try:
            with self._confined():
                spec.loader.exec_module(module)
        except Fault:
            raise
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            raise Fault(
                "importing the candidate failed: " + candidate_traceback(exc, path),
                candidate_lineno(exc, path),
            ) from None
        cls = getattr(module, "ModelNew", None)
        if cls is None:
            raise Fault("the candidate does not define ModelNew")
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise Fault("ModelNew is not a torch.nn.Module subclass")
        self.model_cls = cls
        return {}

    def op_load_problem(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kerneljudge.problem import Problem

        self.problem = Problem.load(str(msg["path"]), probe=False)  # the probe ran before
        self.problem.use_shape_set(str(msg.get("shape_set", "public")))
        self.model_cls = self.problem.module.Model
        self.source_path = str(self.problem.path)
        return {}

    def op_setup(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.model_cls is None:
            raise RuntimeError("setup before load")
        init_inputs = list(msg.get("init_inputs", []))
        self.model, self.compiled = None, None  # the last shape set's go before this one's draw
        self.sets, self.nudgeable, self.snapshots, self.graphs = [], [], {}, {}
        (model, state), reply = seeded_weights(self, msg, init_inputs)  # model: the reference's
        if reply.get("drawn") is False:
            return reply
        try:
            with self._confined():  # the constructor is candidate code too
                if model is None:
                    model, note = candidate_model(self.model_cls, init_inputs, self.device, state)
                    reply["note"] = note
                self.model = model.to(self.device).eval()
        except Fault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise Fault(
                "constructing the model failed: " + candidate_traceback(exc, self.source_path)
            ) from None
        return {"note": "", **reply}

    def _call(self, fn: Callable[..., Any], args: list[Any], record_ops: bool = False) -> Any:
        """One forward call, confined, synchronised; with the ATen ops it ran when asked."""
        recorder = OpRecorder() if record_ops else None
        try:
            with self._confined(), torch.no_grad():
                if recorder is not None:
                    with recorder:
                        out = fn(*args)
                else:
                    out = fn(*args)
                if self.device.type == "cuda":
                    _synchronize()
        except Fault:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit, CUDA errors, anything
            raise Fault(
                candidate_traceback(exc, self.source_path),
                candidate_lineno(exc, self.source_path),
            ) from None
        self._check_output(out)
        self.ops = sorted(recorder.ops) if recorder is not None else []
        return out

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One correctness trial on ``inputs``; keeps them as an input set for the timed loop.

        Returns ``outputs`` (on the CPU), ``oracle`` (float64 reference, when asked; and
        ``oracle_on_host`` where the GPU ran out of memory for it), ``ops`` (ATen operators run,
        when ``record_ops``), ``aliases_input`` and ``modified_inputs`` (:func:`input_effects`).
        With ``keep`` false (a timed call checked again), the inputs are not kept as a set.

        In the reference worker, ``expect`` (a key) keeps the outputs and oracle here for
        :meth:`op_compare` and replies with their layout instead (``output_layout``,
        ``input_layout``: ``[shape, dtype name]`` per tensor, flattened), ``call_s``, the
        seconds of the call itself on this worker's clock, and ``room`` (:meth:`room_for_another`
        within ``keep_bytes``); ``hold_inputs`` also holds the inputs (:meth:`hold`; for
        :meth:`op_held_inputs`, ``from_held``), replying ``input_fingerprint``, ``drawn_on_device``.
        With ``from_held`` (a key) and ``perturb`` (a seed) the inputs are the held ones of that
        key as a timed call got them (:func:`~kerneljudge.worker.measure.perturb`, with ``roll``),
        built on this worker's device. ``seed`` instead of ``inputs`` draws them here, on the
        device with ``on_device`` (:func:`kerneljudge.worker.drawn.inputs_from_seed`); a
        candidate's worker given the reference's ``fingerprint`` replies ``{"drawn": False}``
        when its draw differs.
        """
        if self.model is None:
            raise RuntimeError("run before setup")
        on_device = False
        # A CPU worker's audited call (inputs neither kept nor held) reuses the last one's spares.
        kept_or_held = msg.get("keep", True) or msg.get("hold_inputs")
        audit = "from_held" in msg and self.device.type == "cpu" and not kept_or_held
        if "from_held" in msg:
            base = self.held_inputs_of(msg["from_held"])
            # Rebuilt here, not rolled on the host and copied: perturb is exact on any device.
            received = measure.perturb(
                to_device(base, self.device),
                nudgeable(base),
                int(msg["perturb"]),
                bool(msg.get("roll", True)),
                into=self.spares.get("audit") if audit else None,
            )
            del base  # a GPU's redraw: not held through the call and its float64 oracle
            if audit:
                self.spares["audit"] = received
        elif "seed" in msg:  # drawn here (kerneljudge.worker.drawn): checked in a candidate's
            drawn, on_device = inputs_from_seed(
                self, int(msg["seed"]), msg.get("fingerprint"), bool(msg.get("on_device"))
            )
            if drawn is None:
                return {"drawn": False}
            received = drawn
        else:
            received = list(msg["inputs"])
        self.inputs = to_device(received, self.device)
        if msg.get("keep", True):
            keep = self._sets_kept(nbytes(self.inputs))
            self.sets = (self.sets + [self.inputs])[-keep:]
            # Decided on the inputs as sent (a copy to the device can change their layout),
            # as the supervisor decides when it rebuilds a timed call's inputs.
            self.nudgeable = (self.nudgeable + [nudgeable(received)])[-keep:]
        args = call_copies(self.inputs, self.spares if audit else None)
        measure.poison(self.poison_bytes or nbytes(args), self.device)
        started = time.perf_counter()
        out = self._call(self.model, args, record_ops=bool(msg.get("record_ops")))
        call_s = time.perf_counter() - started
        # (An audited call's reply is not read: its inputs are the reference's own perturbed.)
        effects = {} if "from_held" in msg else input_effects(args, self.inputs, out)
        self.poison_bytes = max(self.poison_bytes, nbytes(measure.flatten_tensors(out)))
        kept = msg.get("expect") is not None and self.role == "reference"
        # Sent on a pipe of their own, they leave the device only if they cannot go on it.
        outputs = self.keep_copy(out) if kept else out if msg.get("side") else to_cpu(out)
        del out, args
        tries: list[str] = []
        oracle = self._oracle(kept, audit, tries) if msg.get("oracle") else None
        if tries == ["cuda out of memory", "cpu"]:  # the device had no room for it
            effects["oracle_on_host"] = True
        release(self.device)  # what the call and the oracle freed: the GPU is shared
        if kept:
            key = str(msg["expect"])
            self.expected[key] = {"outputs": outputs, "oracle": oracle}
            described = {"ops": self.ops, "call_s": call_s, **effects}
            described.update(output_layout=layout(outputs), input_layout=layout(received))
            if msg.get("hold_inputs"):
                described.update(self.hold(key, received, msg.get("seed"), on_device))
            described["room"] = self.room_for_another(key, int(msg.get("keep_bytes") or 0))
            return described
        reply: dict[str, Any] = {**outputs_reply(self.handoff, msg, outputs, to_cpu), **effects}
        reply["ops"] = self.ops
        if msg.get("oracle"):
            reply["oracle"] = oracle
        return reply

    def _sets_kept(self, set_bytes: int) -> int:
        """How many input sets of ``set_bytes`` bytes to keep: :data:`MAX_TIMING_SETS`, fewer on
        a GPU where they would take more than :data:`SETS_DEVICE_SHARE` of its memory."""
        if self.device.type != "cuda" or not set_bytes:
            return MAX_TIMING_SETS
        total = torch.cuda.get_device_properties(self.device).total_memory
        return max(1, min(MAX_TIMING_SETS, int(SETS_DEVICE_SHARE * total) // set_bytes))

    def _oracle(self, kept: bool, reuse: bool, tries: list[str]) -> Any:
        """The reference in float64 on the current inputs (:func:`~kerneljudge.worker.forward.
        float64_oracle`, ``tries`` its ``tries_made``); ``kept``: copied as :meth:`keep_copy`
        keeps a trial's tensors, else to the CPU; ``reuse``: the upcast inputs written over."""
        assert self.model is not None
        keep = self.keep_copy if kept else None
        spare = self.spares.setdefault("float64", []) if reuse else None
        return float64_oracle(self.model, self.inputs, self.device, keep, spare, tries)

    def op_compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compile the reference with ``torch.compile`` and warm it up on the current inputs."""
        if self.model is None:
            raise RuntimeError("compile before setup")
        started = time.monotonic()
        try:
            self.compiled = torch.compile(self.model)
            for _ in range(2):
                self._call(self.compiled, call_copies(self.inputs))
        except Fault as exc:
            self.compiled = None
            raise Fault(f"torch.compile failed: {exc}") from None
        return {"compile_s": time.monotonic() - started}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time ``n`` calls over the kept input sets (see :mod:`kerneljudge.worker.measure`).

        With ``link = {"batch", "seed"}`` (and a stamp socket) every call is marked and
        committed on the socket, its seed and audit slot come from the supervisor, and the
        outputs of the calls it keeps are stored by slot for :meth:`op_timed_outputs`. With
        ``graph`` true, each call replays the target's graph (:meth:`op_capture` first).
        Returns ``times_ms`` (one per call), ``wall_s`` (the timed calls' iterations, host
        clock), ``n_sets`` and, with a link, ``between_cpu_ms``: this process's CPU time from
        each call's end mark to the next one's start mark (warm-up calls included). A Python
        thread started by a call and alive at its end mark is a rejecting Fault.
        """
        fn = self.compiled if msg.get("target") == "compile" else self.model
        graph = self.graphs.get(str(msg.get("target"))) if msg.get("graph") else None
        if fn is None or not self.sets or (msg.get("graph") and graph is None):
            raise RuntimeError(f"nothing to time for target {msg.get('target')!r}")
        self._drop_spares()  # neither these nor inputs that are no kept set are held when timed
        self.inputs = next((s for s in self.sets if s is self.inputs), self.sets[-1])
        flush_bytes = int(msg.get("flush_bytes", 0))
        if self.device.type == "cuda" and flush_bytes:
            if self.flush is None or self.flush.numel() != flush_bytes:
                # After the cached blocks went back: carved out of one, it could keep it reserved.
                self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device=self.device)
        before = thread_idents()
        spec = msg.get("link")
        link = None
        if isinstance(spec, dict) and self.stamp_sock is not None:
            spin = measure.SPIN_NS if self.device.type == "cuda" else 0
            link = measure.Link(self.stamp_sock, int(spec["batch"]), spin)
        try:
            with self._confined():
                times, kept, wall = _time_calls(
                    fn,
                    self.sets,
                    n=int(msg["n"]),
                    warmup=int(msg.get("warmup", 0)),
                    device=self.device,
                    flush=self.flush,
                    poison_bytes=self.poison_bytes,
                    nudgeable=self.nudgeable,
                    check_call=self._check_output,
                    roll=bool(msg.get("roll", True)),
                    link=link,
                    seed=int(spec["seed"]) if link is not None and isinstance(spec, dict) else None,
                    threads_before=before,  # checked on both sides: the same work per call
                    reject_threads=self.sandbox is not None,
                    graph=graph,
                    kept_before=self.snapshots,
                )
        except Fault:
            raise
        except measure.ThreadLeftRunning as exc:
            raise Fault(str(exc), status="rejected") from None
        except BaseException as exc:  # noqa: BLE001
            raise Fault(
                candidate_traceback(exc, self.source_path),
                candidate_lineno(exc, self.source_path),
            ) from None
        self.snapshots.update(kept)
        release(self.device)  # what the loop freed, given back: the other side is timed next
        reply = {"times_ms": times, "wall_s": wall, "n_sets": len(self.sets)}
        return {**reply, "between_cpu_ms": link.between_cpu_ms if link is not None else []}

    def op_pin(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Move every thread of this process onto the CPU cores ``cpus`` (a list) for timing,
        and set torch's intra-op threads to ``threads`` (default: one per core of the set; more
        threads than cores make every parallel CPU op wait for each thread's turn). Later
        threads inherit the set; the worker keeps both, whatever it was started with."""
        cpus = {int(c) for c in msg["cpus"]}
        for task in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(task), cpus)
            except OSError:
                pass
        _set_num_threads(max(1, int(msg.get("threads") or len(cpus))))
        return {}

    def op_timed_outputs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Outputs of the timed calls the supervisor kept: ``{"slots": {slot: outputs}}`` (CPU
        copies of those taken at the call's end mark) and ``n_sets``. With ``slots`` (a list),
        only those slots are copied; the others are checked as they would be copied. With
        ``side`` and one slot, its outputs go to that pipe (:func:`kerneljudge.worker.side.
        outputs_reply`) and the slot's entry is their number."""
        wanted = msg.get("slots")
        try:
            slots: dict[int, Any] = {}
            for s, outs in self.snapshots.items():
                check_cpu_copyable(list(outs))
                key = int(s)  # (raises on a record replaced by code under test, as below)
                if wanted is None or key in wanted:
                    slots[key] = list(outs)
            if not (msg.get("side") and len(slots) == 1):
                slots = {s: to_cpu(outs) for s, outs in slots.items()}
        except (TypeError, ValueError):  # the record was replaced by code under test
            return {"slots": None, "n_sets": len(self.sets)}
        if msg.get("side") and len(slots) == 1:
            ((s, outs),) = slots.items()
            outputs_reply(self.handoff, msg, outs, as_sent, self.device)  # the device's way
            slots = {s: len(outs)}
        return {"slots": slots, "n_sets": len(self.sets)}

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run ``calls`` forward calls under torch.profiler on the current inputs.

        Returns ``rows``: ``{name, device_time_ms, calls, share}`` per GPU kernel or copy (on
        CUDA) or per operator by self CPU time (on the CPU, where the forward's own Python and
        extension code is the row ``ModelNew.forward``); time and calls are per forward call,
        ``share`` the fraction of all rows' time; largest first, at most 30 rows.
        """
        if self.model is None:
            raise RuntimeError("profile before setup")
        n = max(1, int(msg.get("calls", 5)))
        model = self.model
        rows = profile_rows(lambda args: self._call(model, args), self.inputs, n, self.device)
        return {"rows": rows, "calls": n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerneljudge.worker")
    parser.add_argument("--role", choices=("reference", "candidate"), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--stamp-fd", type=int, default=-1, help="the timed calls' stamp socket")
    parser.add_argument("--handoff-fd", type=int, default=-1, help="kerneljudge.worker.side")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--record-ops", action="store_true", help="its trials record operators")
    args = parser.parse_args(argv)
    sys.dont_write_bytecode = True  # candidate modules leave no __pycache__ in the build cache
    drop_no_cuda_runtime_notice()  # a candidate's load_inline on a CPU device would log it
    chan = Channel(args.read_fd, args.write_fd)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kernels = warm_device(device, args.role)  # the context, kernels, libraries: before any timing
    if args.record_ops:
        # The first call under a TorchDispatchMode (``OpRecorder``, in every trial of a
        # problem that requires a custom kernel) imports torch._dynamo, 1-3 s: here, while the
        # worker waits in the pool, not in the candidate's first correctness trial.
        with OpRecorder():
            torch.ones(1, device=device).add_(1)
    if args.role == "candidate":
        set_subreaper()
        limit_output()
    else:
        set_undumpable()  # the reference holds the reference outputs
    stamps = socket.socket(fileno=args.stamp_fd) if args.stamp_fd >= 0 else None
    worker = Worker(args.role, device, stamps)
    worker.handoff = socket.socket(fileno=args.handoff_fd) if args.handoff_fd >= 0 else None
    return serve(chan, worker, kernels)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
