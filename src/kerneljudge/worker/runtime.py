"""The worker process: runs either the trusted reference or one candidate, on request.

Started by :class:`kerneljudge.worker.process.WorkerProcess` as
``python -m kerneljudge.worker --role {reference,candidate} --device DEV --read-fd R --write-fd W``.
It answers one request at a time (see the handlers below) and exits on ``exit`` or when the
supervisor's pipe closes. A candidate worker serves exactly one candidate and is then discarded.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.worker.protocol import Channel, ChannelClosed

# Captured before any candidate code runs, so a candidate that patches these names in torch
# cannot change how the worker synchronises and reads the clock.
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_perf_counter_ns = time.perf_counter_ns


class Fault(Exception):
    """A failure of the code under test, reported to the supervisor as data.

    Attributes:
        lineno: the candidate line the failure came from, when known.
    """

    def __init__(self, message: str, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


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

    def __init__(self, role: str, device: torch.device) -> None:
        self.role = role
        self.device = device
        self.model: torch.nn.Module | None = None
        self.compiled: Callable[..., Any] | None = None
        self.model_cls: type | None = None
        self.problem: Any = None
        self.source_path: str | None = None
        self.inputs: list[Any] = []
        self.last_output: Any = None
        self.flush: torch.Tensor | None = None

    # ------------------------------------------------------------------ loading
    def op_load_candidate(self, msg: dict[str, Any]) -> dict[str, Any]:
        path = str(msg["path"])
        self.source_path = path
        os.environ.update({str(k): str(v) for k, v in dict(msg.get("env", {})).items()})
        spec = importlib.util.spec_from_file_location("candidate_module", path)
        if spec is None or spec.loader is None:
            raise Fault(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["candidate_module"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
            raise Fault(
                "importing the candidate failed: " + _candidate_traceback(exc, path),
                _candidate_lineno(exc, path),
            ) from None
        cls = getattr(module, "ModelNew", None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise Fault("ModelNew is not a torch.nn.Module subclass")
        self.model_cls = cls
        return {}

    def op_load_problem(self, msg: dict[str, Any]) -> dict[str, Any]:
        from kerneljudge.problem import Problem

        self.problem = Problem.load(str(msg["path"]))
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
            model = self.model_cls(*init_inputs)
        except BaseException as exc:  # noqa: BLE001
            raise Fault(
                "constructing the model failed: " + _candidate_traceback(exc, self.source_path)
            ) from None
        note = align_state_dict(model, state)
        self.model = model.to(self.device).eval()
        self.compiled = None
        return {"note": note}

    # ------------------------------------------------------------------ running
    def _call(self, fn: Callable[..., Any], args: list[Any]) -> Any:
        try:
            with torch.no_grad():
                out = fn(*args)
            if self.device.type == "cuda":
                _synchronize()
        except BaseException as exc:  # noqa: BLE001 - SystemExit, CUDA errors, anything
            raise Fault(_candidate_traceback(exc, self.source_path)) from None
        return out

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self.model is None:
            raise RuntimeError("run before setup")
        self.inputs = _to_device(list(msg["inputs"]), self.device)
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs]
        reply: dict[str, Any] = {"outputs": _to_cpu(self._call(self.model, args))}
        if msg.get("oracle"):
            reply["oracle"] = self._oracle()
        return reply

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
        """Time ``n`` calls; each on fresh clones of the inputs, after an L2 flush.

        On CUDA: events around the call with a device-wide synchronisation before the end mark,
        so work on any stream counts. On CPU: ``perf_counter_ns`` around the call.
        Returns ``times_ms`` (one per call) and ``wall_s`` (the whole batch, host clock).
        """
        fn = self.compiled if msg.get("target") == "compile" else self.model
        if fn is None:
            raise RuntimeError(f"no callable for target {msg.get('target')!r}")
        n, warmup = int(msg["n"]), int(msg.get("warmup", 0))
        flush_bytes = int(msg.get("flush_bytes", 0))
        cuda = self.device.type == "cuda"
        if cuda and flush_bytes and (self.flush is None or self.flush.numel() != flush_bytes):
            self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device=self.device)
        start_ev, end_ev = (
            (_Event(enable_timing=True), _Event(enable_timing=True)) if cuda else (None, None)
        )
        times: list[float] = []
        wall0 = _perf_counter_ns()
        out = None
        for i in range(warmup + n):
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in self.inputs]
            try:
                with torch.no_grad():
                    if cuda:
                        if self.flush is not None:
                            self.flush.fill_(i & 0xFF)
                        _synchronize()
                        start_ev.record()
                        out = fn(*args)
                        _synchronize()
                        end_ev.record()
                        end_ev.synchronize()
                        elapsed = start_ev.elapsed_time(end_ev)
                    else:
                        t0 = _perf_counter_ns()
                        out = fn(*args)
                        elapsed = (_perf_counter_ns() - t0) / 1e6
            except BaseException as exc:  # noqa: BLE001
                raise Fault(_candidate_traceback(exc, self.source_path)) from None
            if i >= warmup:
                times.append(float(elapsed))
        self.last_output = out
        return {"times_ms": times, "wall_s": (_perf_counter_ns() - wall0) / 1e9}

    def op_last_output(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"outputs": _to_cpu(self.last_output)}


def serve(chan: Channel, worker: Worker) -> int:
    """Answer requests until ``exit`` or a closed pipe; returns the exit code."""
    chan.send({"op": "ready", "pid": os.getpid()})
    while True:
        try:
            msg = chan.recv()
        except ChannelClosed:
            return 0
        op = str(msg.get("op", ""))
        if op == "exit":
            chan.send({"ok": True})
            return 0
        handler = getattr(worker, f"op_{op}", None)
        if handler is None:
            chan.send({"ok": False, "fault": False, "error": f"unknown op {op!r}"})
            continue
        try:
            reply = handler(msg)
            reply["ok"] = True
        except Fault as exc:
            reply = {"ok": False, "fault": True, "error": str(exc), "lineno": exc.lineno}
        except BaseException as exc:  # noqa: BLE001 - report harness bugs, keep the traceback
            reply = {"ok": False, "fault": False, "error": traceback.format_exc(limit=8)}
            if isinstance(exc, KeyboardInterrupt):
                raise
        sys.stdout.flush()
        sys.stderr.flush()
        chan.send(reply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerneljudge.worker")
    parser.add_argument("--role", choices=("reference", "candidate"), required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    chan = Channel(args.read_fd, args.write_fd)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.empty(1, device=device)  # create the context now, not in the first timed call
    return serve(chan, Worker(args.role, device))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
