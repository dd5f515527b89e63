"""CUDA-graph capture of a forward call, for the timing stage's graph replay.

A call is captured once per target on static copies of the first kept input set (the kept sets
must share one :func:`signature`): two untimed calls on a side stream first (lazy
initialisations such as cuBLAS handles must not happen during capture), then one call under
:class:`torch.cuda.CUDAGraph` capture. A timed replay then fills the static outputs (NaN for
floats: :func:`kerneljudge.worker.measure.unwritten`, so an output the replay does not write is
wrong), loads its call's inputs (perturbed as a launched call's are) into the static inputs,
and replays the graph; the outputs are read from the static
output tensors. The capture is checked once before it is used: the graph replayed on inputs
perturbed under a fixed seed must give what the call itself gives on them (allclose with
``REPLAY_RTOL``/``REPLAY_ATOL``), else the forward has host logic (a branch on values, a
Python-side cache, work outside the captured stream) that the graph froze.

What cannot be captured is not an error of the candidate: :class:`NotCapturable` carries the
reason (a kernel launched on the legacy default stream, a synchronising call, a host read of a
device value, CPU tensors, out of memory, a replay that differs), and the stage times that
contestant by its launched calls alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kerneljudge.worker.forward import Fault
from kerneljudge.worker.measure import flatten_tensors, load_static, perturb, plans

__all__ = [
    "REPLAY_ATOL",
    "REPLAY_RTOL",
    "Captured",
    "NotCapturable",
    "capture",
    "signature",
]

# Bound before candidate code runs (see kerneljudge.worker.measure).
_Graph = torch.cuda.CUDAGraph
_graph_ctx = torch.cuda.graph
_Stream = torch.cuda.Stream
_stream_ctx = torch.cuda.stream
_current_stream = torch.cuda.current_stream
_synchronize = torch.cuda.synchronize
_set_stream = torch.cuda.set_stream
_replay = torch._C._CUDAGraph.replay  # no replay hooks (see kerneljudge.worker.measure)
_allclose = torch.allclose

#: Tolerances of the check that a replay gives what the call gives on the same inputs (the same
#: kernels on the same data: only the order of floating-point atomics may differ).
REPLAY_RTOL = 1e-3
REPLAY_ATOL = 1e-5
#: Seed of the inputs of that check.
CHECK_SEED = 0x5EED


class NotCapturable(Exception):
    """The call cannot be timed by graph replay; ``str(exc)`` says why in one line."""


def signature(args: list[Any]) -> tuple[Any, ...]:
    """What a captured graph is bound to: each tensor's shape, stride, dtype and device, and
    every other argument's value (a graph replays with the values it was captured with)."""
    return tuple(
        ("tensor", tuple(x.shape), x.stride(), str(x.dtype), str(x.device))
        if isinstance(x, torch.Tensor)
        else ("value", type(x).__name__, repr(x))
        for x in args
    )


@dataclass
class Captured:
    """A captured call: its graph, the static inputs it reads and the static outputs it writes."""

    graph: Any
    static_args: list[Any]
    outputs: Any

    def load(self, args: list[Any]) -> None:
        """:func:`kerneljudge.worker.measure.load_static` for this graph: ``args`` (with
        :func:`signature` equal to the captured one) into its static inputs."""
        load_static(self.static_args, flatten_tensors(self.outputs), args)

    def replay(self) -> Any:
        """Replay the graph on the current stream; returns the static outputs."""
        _replay(self.graph)
        return self.outputs


def _reason(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    lowered = text.lower()
    if "out of memory" in lowered:
        why = "out of memory while capturing"
    elif "capturing" in lowered or "capture" in lowered:
        why = (
            "the forward does something a capture forbids (a kernel launched on the legacy "
            "default stream, <<<grid, block>>> with no stream: launch it on "
            "at::cuda::getCurrentCUDAStream(); a synchronisation; a host read of a device "
            "value; a copy to or from the host)"
        )
    else:
        why = "the forward raised while it was captured"
    return f"{why}: {text[:300]}"


def capture(
    fn: Callable[..., Any],
    args: list[Any],
    device: torch.device,
    check_output: Callable[[Any], None] | None = None,
) -> Captured:
    """Capture ``fn(*static copies of args)`` into a CUDA graph, and check one replay.

    Args:
        fn: the forward (the reference model or the candidate's), called under no_grad.
        args: one kept input set, on ``device``.
        device: a CUDA device.
        check_output: called with the captured call's outputs (may raise, e.g. a Fault for a
            tensor subclass).

    Raises:
        NotCapturable: why this call cannot be replayed (see the module's docstring).
    """
    if device.type != "cuda":
        raise NotCapturable("graph replay needs a CUDA device")
    if any(isinstance(x, torch.Tensor) and x.device.type != "cuda" for x in args):
        raise NotCapturable("an input is not on the judging device")
    static = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    graph = _Graph()
    caller = _current_stream(device)
    try:
        with torch.no_grad():
            side = _Stream(device=device)
            side.wait_stream(_current_stream(device))
            with _stream_ctx(side):
                for _ in range(2):
                    fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in static])
            _current_stream(device).wait_stream(side)
            _synchronize()
            with _graph_ctx(graph):
                outputs = fn(*static)
        _synchronize()
    except Exception as exc:  # noqa: BLE001 - whatever the forward raised under capture
        _recover(caller, device)
        raise NotCapturable(_reason(exc)) from None
    if check_output is not None:
        check_output(outputs)
    if not flatten_tensors(outputs):
        raise NotCapturable("the forward returned no tensor")
    captured = Captured(graph, static, outputs)
    _check_replay(fn, captured, args, device)
    return captured


def _recover(caller: Any, device: torch.device) -> None:
    """Leave no failed capture behind: the caller's stream current again (a capture that fails
    in its end leaves its own stream current), the device synchronised (a failure there is
    the capture's, already reported), and the device's default generator usable again: a
    capture that fails before its end leaves it marked as being captured, and every later
    draw on it in this process raised "Offset increment outside graph capture encountered
    unexpectedly". Its state is replaced by a copy, the same seed and offset, not marked (a
    graph captured before in this process keeps the state it registered)."""
    try:
        _set_stream(caller)
        _synchronize()
    except Exception:  # noqa: BLE001
        pass
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        generator.graphsafe_set_state(generator.clone_state())
    except Exception:  # noqa: BLE001 - a torch without these: its draws raise as they did
        pass


def _check_replay(
    fn: Callable[..., Any], captured: Captured, args: list[Any], device: torch.device
) -> None:
    which = plans(args)
    caller = _current_stream(device)
    with torch.no_grad():
        try:
            # Each side gets its own copy: a forward may change its inputs in place.
            expected = [t.clone() for t in flatten_tensors(fn(*perturb(args, which, CHECK_SEED)))]
            captured.load(perturb(args, which, CHECK_SEED))
            got = [t.clone() for t in flatten_tensors(captured.replay())]
            _synchronize()
        except Exception as exc:  # noqa: BLE001
            _recover(caller, device)
            raise NotCapturable(f"the replay check failed: {_reason(exc)}") from None
    same = len(got) == len(expected) and all(
        g.shape == e.shape
        and g.dtype == e.dtype
        and (
            _allclose(g, e, rtol=REPLAY_RTOL, atol=REPLAY_ATOL, equal_nan=True)
            if g.is_floating_point() or g.is_complex()
            else bool((g == e).all())
        )
        for g, e in zip(got, expected)
    )
    if not same:
        raise NotCapturable(
            "a replay on fresh inputs differs from the call itself: the forward has host "
            "logic (a branch on values, a cache) or work outside the captured stream (a "
            "kernel launched on the legacy default stream, <<<grid, block>>> with no stream: "
            "launch it on at::cuda::getCurrentCUDAStream()) that the graph did not record"
        )


class CapturedCalls:
    """The handler ``capture`` (``op_capture``) and the graphs it keeps, a mixin of
    :class:`kerneljudge.worker.runtime.Worker` (whose ``op_setup`` drops them)."""

    device: Any
    model: Any
    compiled: Any
    sets: list[list[Any]]
    graphs: dict[str, Captured]

    def _confined(self) -> Any: ...  # the worker's (kerneljudge.worker.calls.Confined)

    def _check_output(self, out: Any) -> None: ...

    def op_drop_graphs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Drop every captured graph (their static tensors and memory pools)."""
        self.graphs.clear()
        return {}

    def op_capture(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Capture the forward of ``target`` (``compile``: the compiled reference; any other
        name: the model) on the first kept input set, for ``time`` requests with ``graph``.

        Returns ``captured`` (bool), ``reason`` (why not, one line; empty when captured) and
        ``capture_s`` (seconds, on this worker's clock). The capture runs confined: what the
        sandbox refuses is a rejecting Fault, as in any call; an exception that is not an
        ``Exception`` (``SystemExit``) from the forward is a Fault too. Running out of device
        memory anywhere in it (the static copies of an input set of GiBs, the replay check's
        copies) is a refusal, as a capture that runs out inside the forward is: the stage
        then times the target by its launched calls alone.
        """
        import time

        target = str(msg.get("target", ""))
        fn = self.compiled if target == "compile" else self.model
        if fn is None or not self.sets:
            raise RuntimeError(f"nothing to capture for target {target!r}")
        started = time.monotonic()
        self.graphs.pop(target, None)
        if len({signature(args) for args in self.sets}) > 1:
            return {
                "captured": False,
                "reason": "the kept input sets differ in shape, layout or value arguments",
                "capture_s": 0.0,
            }
        out_of_memory = False
        try:
            with self._confined():
                self.graphs[target] = capture(fn, self.sets[0], self.device, self._check_output)
        except NotCapturable as exc:
            return {"captured": False, "reason": str(exc), "capture_s": time.monotonic() - started}
        except Fault:
            raise
        except torch.cuda.OutOfMemoryError:  # the static copies or the replay check's
            out_of_memory = True
        except BaseException as exc:  # noqa: BLE001 - SystemExit and the like from the forward
            raise Fault(f"capturing the forward failed: {type(exc).__name__}: {exc}") from None
        if out_of_memory:  # past the handler, whose traceback held the copies made so far
            self.graphs.pop(target, None)
            torch.cuda.empty_cache()  # the device is shared with the other worker
            why = "out of memory while capturing: no room for the static inputs and outputs"
            return {"captured": False, "reason": why, "capture_s": time.monotonic() - started}
        return {"captured": True, "reason": "", "capture_s": time.monotonic() - started}
