"""The worker process: runs either the trusted reference or one candidate, on request.

Started by :class:`kerneljudge.worker.process.WorkerProcess` as
``python -m kerneljudge.worker --role {reference,candidate} --device DEV --read-fd R --write-fd W``.
It answers one request at a time (see the handlers below) and exits on ``exit`` or when the
supervisor's pipe closes. A candidate worker serves exactly one candidate and is then discarded.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import errno
import importlib.util
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._python_dispatch

from kerneljudge.worker import measure
from kerneljudge.worker.protocol import Channel, ChannelClosed
from kerneljudge.worker.sandbox import (
    LOG_LIMIT_BYTES,
    Sandbox,
    child_pids,
    limit_output,
    lingering_threads,
    set_subreaper,
    set_undumpable,
    thread_idents,
)
from kerneljudge.worker.torchlog import drop_no_cuda_runtime_notice

# Captured before any candidate code runs, so a candidate that patches these names in torch
# cannot change how the worker synchronises or how many threads it runs once pinned.
_synchronize = torch.cuda.synchronize
_set_num_threads = torch.set_num_threads
# The timed loop and the request handlers are bound here, before candidate code runs, so that
# patching ``measure.time_calls`` or the ``Worker`` class afterwards does not reach them.
_time_calls = measure.time_calls
#: Input sets kept for the timed loop (the latest trials'), each timed call uses one in turn.
MAX_TIMING_SETS = 4


class Fault(Exception):
    """A failure of the code under test, reported to the supervisor as data.

    Attributes:
        lineno: the candidate line the failure came from, when known.
        status: the verdict status it implies: ``runtime_error``, or ``rejected`` for a policy
            violation (network, processes, writes outside the scratch folder, ...).
    """

    def __init__(self, message: str, lineno: int | None = None, status: str = "runtime_error"):
        super().__init__(message)
        self.lineno = lineno
        self.status = status


class _OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the names of the ATen operators a call runs (``mm``, ``_softmax``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _candidate_lineno(exc: BaseException, path: str | None) -> int | None:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if path and f.filename == path]
    if frames:
        return frames[-1].lineno
    return getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None


def _to_device(values: list[Any], device: torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu").clone()
    if isinstance(value, (tuple, list)):
        return (
            [_to_cpu(v) for v in value]
            if isinstance(value, list)
            else tuple(_to_cpu(v) for v in value)
        )
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise Fault(f"forward returned an unsupported {type(value).__name__}; return tensors")


def _check_cpu_copyable(value: Any) -> None:
    """Raise what :func:`_to_cpu` raises for ``value``, without copying it."""
    if isinstance(value, (tuple, list)):
        for v in value:
            _check_cpu_copyable(v)
    elif not (value is None or isinstance(value, (torch.Tensor, bool, int, float))):
        raise Fault(f"forward returned an unsupported {type(value).__name__}; return tensors")


def _layout(values: Any) -> list[list[Any]]:
    """``[shape, dtype name]`` of each tensor in ``values`` (nested lists/tuples flattened)."""
    return [
        [list(t.shape), str(t.dtype).removeprefix("torch.")]
        for t in measure.flatten_tensors(values)
    ]


def trial_fields(result: Any) -> dict[str, Any]:
    """A :class:`~kerneljudge.verdict.TrialResult` as plain data for the wire (its
    mismatches as ``[index, expected, got]``)."""
    fields = dataclasses.asdict(result)
    fields["mismatches"] = [[list(m.index), m.expected, m.got] for m in result.mismatches]
    return fields


def _to_double(values: list[Any]) -> list[Any]:
    return [
        v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values
    ]


def _candidate_traceback(exc: BaseException, path: str | None) -> str:
    """The exception with only the frames in the candidate file (all frames when none are)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path and f.filename == path]
    lines = [f"  line {f.lineno}: {(f.line or '').strip()}" for f in (mine or frames)[-6:]]
    head = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        head = f"the candidate wrote more than {LOG_LIMIT_BYTES >> 20} MiB of output ({head})"
    return "\n".join([head, *lines]) if lines else head


def align_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str:
    """Load the reference's parameters into ``model``; returns a note when matched by position.

    Names are matched first. When they differ but the ordered list of shapes is identical, the
    tensors are loaded by position.

    Raises:
        Fault: the parameters do not line up, with the names and shapes that differ.
    """
    own = model.state_dict()
    if not state:
        return ""
    if set(own) == set(state) and all(own[k].shape == state[k].shape for k in own):
        model.load_state_dict(state, strict=True)
        return ""
    own_shapes = [tuple(v.shape) for v in own.values()]
    ref_shapes = [tuple(v.shape) for v in state.values()]
    if own_shapes == ref_shapes:
        model.load_state_dict(dict(zip(own.keys(), state.values())), strict=True)
        return "ModelNew's parameters were matched to Model's by position (names differ)"
    missing = [f"{k}{tuple(v.shape)}" for k, v in state.items() if k not in own]
    extra = [f"{k}{tuple(v.shape)}" for k, v in own.items() if k not in state]
    wrong = [
        f"{k}: {tuple(own[k].shape)} vs {tuple(v.shape)}"
        for k, v in state.items()
        if k in own and own[k].shape != v.shape
    ]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing[:6]))
    if extra:
        parts.append("unexpected " + ", ".join(extra[:6]))
    if wrong:
        parts.append("shape mismatch " + ", ".join(wrong[:6]))
    raise Fault("ModelNew's parameters do not line up with Model's: " + "; ".join(parts))


class Worker:
    """State of one worker process and its request handlers (``op_<name>``)."""

    def __init__(
        self, role: str, device: torch.device, stamp_sock: socket.socket | None = None
    ) -> None:
        self.role = role
        self.stamp_sock = stamp_sock
        self.device = device
        self.model: torch.nn.Module | None = None
        self.compiled: Callable[..., Any] | None = None
        self.model_cls: type | None = None
        self.problem: Any = None
        self.source_path: str | None = None
        self.inputs: list[Any] = []
        self.sets: list[list[Any]] = []
        self.nudgeable: list[list[bool]] = []
        self.snapshots: dict[int, Any] = {}
        #: The reference's side of the trials, by the supervisor's key: outputs and float64
        #: oracle (``{"outputs", "oracle"}``) and, when asked, the inputs as received.
        self.expected: dict[str, dict[str, Any]] = {}
        self.held: dict[str, list[Any]] = {}
        self.poison_bytes = 0
        self.flush: torch.Tensor | None = None
        self.sandbox: Sandbox | None = None
        if role == "candidate":
            self.sandbox = Sandbox([os.getcwd(), os.environ.get("TMPDIR", os.getcwd())])
            for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                if os.environ.get(var):
                    self.sandbox.allow_writes_to(os.environ[var])
            self.sandbox.allow_writes_to(os.path.expanduser("~/.triton"))
            self.sandbox.install()

    # ------------------------------------------------------------------ confinement
    def _confined(self) -> _Confined:
        return _Confined(self)

    def _check_output(self, out: Any) -> None:
        """Outputs must be plain tensors (no subclass that computes later)."""
        for t in measure.flatten_tensors(out):
            if type(t) is not torch.Tensor:
                raise Fault(
                    f"forward returned a {type(t).__name__}, not a plain torch.Tensor",
                    status="rejected",
                )

    # ------------------------------------------------------------------ loading
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
                "importing the candidate failed: " + _candidate_traceback(exc, path),
                _candidate_lineno(exc, path),
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
        state = dict(msg.get("state_dict", {}))
        try:
            with self._confined():  # the constructor is candidate code too
                model = self.model_cls(*init_inputs)
                note = align_state_dict(model, state)
                self.model = model.to(self.device).eval()
        except Fault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise Fault(
                "constructing the model failed: " + _candidate_traceback(exc, self.source_path)
            ) from None
        self.compiled = None
        self.sets, self.nudgeable, self.snapshots = [], [], {}
        return {"note": note}

    # ------------------------------------------------------------------ running
    def _call(self, fn: Callable[..., Any], args: list[Any], record_ops: bool = False) -> Any:
        """One forward call, confined, synchronised; with the ATen ops it ran when asked."""
        recorder = _OpRecorder() if record_ops else None
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
                _candidate_traceback(exc, self.source_path),
                _candidate_lineno(exc, self.source_path),
            ) from None
        self._check_output(out)
        self.ops = sorted(recorder.ops) if recorder is not None else []
        return out

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One correctness trial on ``inputs``; keeps them as an input set for the timed loop.

        Returns ``outputs`` (on the CPU), ``oracle`` (float64 reference, when asked), ``ops``
        (ATen operators the call ran, when ``record_ops``), ``aliases_input`` (an output shares
        storage with an input) and ``modified_inputs`` (indices of inputs changed in place).
        With ``keep`` false (a timed call checked again), the inputs are not kept as a set.

        In the reference worker, ``expect`` (a key) keeps the outputs and oracle here for
        :meth:`op_compare` and replies with their layout instead (``output_layout``,
        ``input_layout``: ``[shape, dtype name]`` per tensor, flattened); ``hold_inputs`` also
        keeps the inputs as received, for :meth:`op_held_inputs` and ``from_held``. With
        ``from_held`` (a key) and ``perturb`` (a seed) the inputs are the held ones of that
        key as a timed call got them (:func:`kerneljudge.worker.measure.perturb`, with
        ``roll``), built here on the CPU as the supervisor would.
        """
        if self.model is None:
            raise RuntimeError("run before setup")
        if "from_held" in msg:
            base = self._reference_only(self.held, msg["from_held"])
            received = measure.perturb(
                base,
                [measure.continuous(x) for x in base],
                int(msg["perturb"]),
                bool(msg.get("roll", True)),
            )
        else:
            received = list(msg["inputs"])
        self.inputs = _to_device(received, self.device)
        if msg.get("keep", True):
            self.sets = (self.sets + [self.inputs])[-MAX_TIMING_SETS:]
            # Decided on the inputs as sent (a copy to the device can change their layout),
            # as the supervisor decides when it rebuilds a timed call's inputs.
            self.nudgeable = (self.nudgeable + [[measure.continuous(x) for x in received]])[
                -MAX_TIMING_SETS:
            ]
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs]
        measure.poison(self.poison_bytes or _nbytes(args), self.device)
        out = self._call(self.model, args, record_ops=bool(msg.get("record_ops")))
        effects = _input_effects(args, self.inputs, out)
        self.poison_bytes = max(self.poison_bytes, _nbytes(measure.flatten_tensors(out)))
        outputs = _to_cpu(out)
        del out, args
        oracle = self._oracle() if msg.get("oracle") else None
        if msg.get("expect") is not None and self.role == "reference":
            key = str(msg["expect"])
            self.expected[key] = {"outputs": outputs, "oracle": oracle}
            if msg.get("hold_inputs"):
                self.held[key] = received
            return {
                "ops": self.ops,
                "output_layout": _layout(outputs),
                "input_layout": _layout(received),
                **effects,
            }
        reply: dict[str, Any] = {"outputs": outputs, "ops": self.ops, **effects}
        if msg.get("oracle"):
            reply["oracle"] = oracle
        return reply

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
        """The inputs held under ``key`` (as received: on the CPU), dropped here if ``forget``."""
        inputs = self._reference_only(self.held, msg["key"])
        if msg.get("forget"):
            del self.held[str(msg["key"])]
        return {"inputs": inputs}

    def op_compare(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compare ``outputs`` (a candidate's, relayed by the supervisor) with the reference's
        kept under ``key`` (:func:`kerneljudge.check.compare_outputs` with ``atol``, ``rtol``,
        ``mode`` and ``index``); drops them if ``forget``. Returns ``trial``: the
        :class:`~kerneljudge.verdict.TrialResult` as a dict (:func:`trial_fields`)."""
        from kerneljudge.check import compare_outputs

        kept = self._reference_only(self.expected, msg["key"])
        if msg.get("forget"):
            del self.expected[str(msg["key"])]
        result = compare_outputs(
            kept["outputs"],
            msg["outputs"],
            oracle=kept["oracle"],
            atol=float(msg["atol"]),
            rtol=float(msg["rtol"]),
            mode=str(msg["mode"]),
            index=int(msg.get("index", 0)),
        )
        return {"trial": trial_fields(result)}

    def op_forget(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Drop the kept trials (outputs, oracle, inputs) of ``keys``, or all of them."""
        keys = msg.get("keys")
        if keys is None:
            self.expected.clear()
            self.held.clear()
        for key in map(str, keys or ()):
            self.expected.pop(key, None)
            self.held.pop(key, None)
        return {}

    def _oracle(self) -> Any:
        """The reference evaluated in float64 (on the device, else on the CPU)."""
        assert self.model is not None
        for dev in (self.device, torch.device("cpu")):
            try:
                model64 = copy.deepcopy(self.model).to(dev).double()
                args = _to_double(_to_device(self.inputs, dev))
                with torch.no_grad():
                    return _to_cpu(model64(*args))
            except (RuntimeError, NotImplementedError, TypeError):
                continue
        return None

    def op_compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Compile the reference with ``torch.compile`` and warm it up on the current inputs."""
        if self.model is None:
            raise RuntimeError("compile before setup")
        started = time.monotonic()
        try:
            self.compiled = torch.compile(self.model)
            for _ in range(2):
                self._call(
                    self.compiled,
                    [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs],
                )
        except Fault as exc:
            self.compiled = None
            raise Fault(f"torch.compile failed: {exc}") from None
        return {"compile_s": time.monotonic() - started}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Time ``n`` calls over the kept input sets (see :mod:`kerneljudge.worker.measure`).

        With ``link = {"batch", "seed"}`` (and a stamp socket) every call is marked and
        committed on the socket, its seed and audit slot come from the supervisor, and the
        outputs of the calls it keeps are stored by slot for :meth:`op_timed_outputs`.
        Returns ``times_ms`` (one per call), ``wall_s`` (the timed calls' iterations, host
        clock), ``n_sets`` and, with a link, ``between_cpu_ms``: this process's CPU time from
        each call's end mark to the next one's start mark (warm-up calls included). A Python
        thread started by a call and alive at its end mark is a rejecting Fault.
        """
        fn = self.compiled if msg.get("target") == "compile" else self.model
        if fn is None or not self.sets:
            raise RuntimeError(f"nothing to time for target {msg.get('target')!r}")
        flush_bytes = int(msg.get("flush_bytes", 0))
        if self.device.type == "cuda" and flush_bytes:
            if self.flush is None or self.flush.numel() != flush_bytes:
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
                    seed=int(spec["seed"]) if link is not None else None,
                    threads_before=before if self.sandbox is not None else None,
                )
        except Fault:
            raise
        except measure.ThreadLeftRunning as exc:
            raise Fault(str(exc), status="rejected") from None
        except BaseException as exc:  # noqa: BLE001
            raise Fault(
                _candidate_traceback(exc, self.source_path),
                _candidate_lineno(exc, self.source_path),
            ) from None
        self.snapshots.update(kept)
        between = link.between_cpu_ms if link is not None else []
        return {
            "times_ms": times,
            "wall_s": wall,
            "n_sets": len(self.sets),
            "between_cpu_ms": between,
        }

    def op_pin(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Move every thread of this process onto the CPU cores ``cpus`` (a list) for timing,
        and set torch's intra-op threads to ``threads`` (default: one per core of the set).
        More threads than cores turns every
        parallel CPU op into a wait for each thread's turn (seconds for a few small ops on one
        core). Threads started later inherit the set from the thread that starts them. The
        worker keeps both from then on, whatever ``threads`` it was started with."""
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
        only those slots are copied; the others are checked as they would be copied."""
        wanted = msg.get("slots")
        try:
            slots = {}
            for s, outs in self.snapshots.items():
                if wanted is None or int(s) in wanted:
                    slots[int(s)] = _to_cpu(list(outs))
                else:
                    int(s)
                    _check_cpu_copyable(list(outs))
        except (TypeError, ValueError):  # the record was replaced by code under test
            return {"slots": None, "n_sets": len(self.sets)}
        return {"slots": slots, "n_sets": len(self.sets)}

    def _check_aftermath(self, threads_before: set[int]) -> None:
        """Raise a rejecting Fault for threads or processes that outlived the call."""
        if self.sandbox is None:
            return
        threads = lingering_threads(threads_before)
        if threads:
            raise Fault(
                f"the candidate left {len(threads)} thread(s) running after the call "
                f"({', '.join(threads[:3])})",
                status="rejected",
            )
        kids = child_pids(os.getpid())
        if kids:
            raise Fault(
                f"the candidate left {len(kids)} process(es) running after the call",
                status="rejected",
            )

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Run ``calls`` forward calls under torch.profiler on the current inputs.

        Returns ``rows``: ``{name, device_time_ms, calls, share}`` per GPU kernel or copy (on
        CUDA) or per operator by self CPU time (on the CPU, where the forward's own Python and
        extension code is the row ``ModelNew.forward``); time and calls are per forward call,
        ``share`` the fraction of all rows' time; largest first, at most 30 rows.
        """
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile, record_function

        if self.model is None:
            raise RuntimeError("profile before setup")
        n = max(1, int(msg.get("calls", 5)))
        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

        def clones() -> list[Any]:
            return [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs]

        self._call(self.model, clones())
        batches = [clones() for _ in range(n)]  # cloned outside the profiled window
        with profile(activities=activities) as prof:
            for args in batches:
                with record_function("ModelNew.forward"):
                    self._call(self.model, args)
        totals: dict[str, list[float]] = {}
        for evt in prof.key_averages():
            if cuda:
                if getattr(evt, "device_type", None) != DeviceType.CUDA:
                    continue
                us = getattr(evt, "self_device_time_total", None)
                us = us if us is not None else getattr(evt, "self_cuda_time_total", 0.0)
            else:
                us = evt.self_cpu_time_total
            if us and us > 0:
                entry = totals.setdefault(str(evt.key), [0.0, 0.0])
                entry[0] += float(us)
                entry[1] += float(evt.count)
        total_us = sum(t for t, _ in totals.values()) or 1.0
        rows = [
            {"name": name, "device_time_ms": t / n / 1e3, "calls": c / n, "share": t / total_us}
            for name, (t, c) in totals.items()
        ]
        rows.sort(key=lambda r: -r["device_time_ms"])
        return {"rows": rows[:30], "calls": n}


def _input_effects(args: list[Any], originals: list[Any], out: Any) -> dict[str, Any]:
    """Whether a call returned a view of an input, and which inputs it changed in place."""
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    storages = {a.untyped_storage().data_ptr() for a in inputs if a.numel()}
    aliases = any(
        t.numel() and t.untyped_storage().data_ptr() in storages
        for t in measure.flatten_tensors(out)
    )
    modified = [
        i
        for i, (a, o) in enumerate(zip(args, originals))
        if isinstance(a, torch.Tensor) and not torch.equal(a, o)
    ]
    return {"aliases_input": bool(aliases), "modified_inputs": modified}


def _nbytes(values: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


class _Confined:
    """Arms the sandbox around candidate code and turns what it caught into a rejecting Fault.

    A thread or process left behind by the call is checked by the caller (the timed loop checks
    after every call; a trial checks here).
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.before: set[int] = set()

    def __enter__(self) -> _Confined:
        sb = self.worker.sandbox
        self.before = thread_idents()
        if sb is not None:
            sb.take_violations()
            sb.armed = True
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        sb = self.worker.sandbox
        if sb is None:
            return
        sb.armed = False
        violations = sb.take_violations()
        if violations:
            raise Fault(
                "the candidate attempted " + "; ".join(dict.fromkeys(violations)), status="rejected"
            ) from None
        if exc_type is None:
            self.worker._check_aftermath(self.before)


def serve(chan: Channel, worker: Worker) -> int:
    """Answer requests until ``exit`` or a closed pipe; returns the exit code."""
    handlers = {
        name.removeprefix("op_"): getattr(worker, name)
        for name in dir(worker)
        if name.startswith("op_")
    }
    chan.send({"op": "ready", "pid": os.getpid()})
    while True:
        try:
            msg = chan.recv()
        except ChannelClosed:
            return 0
        op = str(msg.get("op", ""))
        nonce = msg.get("nonce")
        if op == "exit":
            chan.send({"ok": True, "nonce": nonce})
            return 0
        handler = handlers.get(op)
        if handler is None:
            chan.send({"ok": False, "fault": False, "error": f"unknown op {op!r}", "nonce": nonce})
            continue
        try:
            reply = handler(msg)
            reply["ok"] = True
        except Fault as exc:
            reply = {
                "ok": False,
                "fault": True,
                "error": str(exc),
                "lineno": exc.lineno,
                "status": exc.status,
            }
        except BaseException as exc:  # noqa: BLE001 - report harness bugs, keep the traceback
            reply = {"ok": False, "fault": False, "error": traceback.format_exc(limit=8)}
            if isinstance(exc, KeyboardInterrupt):
                raise
        sys.stdout.flush()
        sys.stderr.flush()
        reply["nonce"] = nonce
        chan.send(reply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerneljudge.worker")
    parser.add_argument("--role", choices=("reference", "candidate"), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--stamp-fd", type=int, default=-1, help="the timed calls' stamp socket")
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
        torch.empty(1, device=device)  # create the context now, not in the first timed call
    if args.record_ops:
        # The first call under a TorchDispatchMode (``_OpRecorder``, in every trial of a
        # problem that requires a custom kernel) imports torch._dynamo, 1-3 s: here, while the
        # worker waits in the pool, not in the candidate's first correctness trial.
        with _OpRecorder():
            torch.ones(1, device=device).add_(1)
    if args.role == "candidate":
        set_subreaper()
        limit_output()
    else:
        set_undumpable()  # the reference holds the reference outputs
    stamps = socket.socket(fileno=args.stamp_fd) if args.stamp_fd >= 0 else None
    return serve(chan, Worker(args.role, device, stamps))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
