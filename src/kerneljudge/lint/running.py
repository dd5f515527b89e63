"""How the lint runs the reference and reads its results: one call (timed), the operators it
dispatches (counted by the judge's own recorder, :mod:`kerneljudge.worker.forward`), the
forward's argument names, tensors compared bit for bit or within a tolerance, sizes and times
as text.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.check import flatten_outputs
from kerneljudge.worker.forward import OpRecorder


# ----------------------------------------------------------------------------- tensor helpers
def _tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in flatten_outputs(values) if isinstance(v, torch.Tensor)]


def _map_tensors(values: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(values, torch.Tensor):
        return fn(values)
    if isinstance(values, (tuple, list)):
        return type(values)(_map_tensors(v, fn) for v in values)
    return values


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _nbytes(values: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(values))


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as integers (bit-exact comparison for any dtype, fp8 included)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        return t
    return t.view(_INT_OF_SIZE[t.element_size()])


def _identical(a: Any, b: Any) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return False
    return all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bits(x), _bits(y))
        for x, y in zip(ta, tb)
    )


def _differs(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Some output of ``b`` differs from ``a`` beyond (atol, rtol); integers exactly."""
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return True
    for x, y in zip(ta, tb):
        if x.shape != y.shape:
            return True
        if x.is_floating_point():
            if not torch.allclose(
                x.cpu().double(), y.cpu().double(), atol=atol, rtol=rtol, equal_nan=True
            ):
                return True
        elif not torch.equal(x.cpu(), y.cpu()):
            return True
    return False


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _fmt_s(t: float) -> str:
    return f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


# ----------------------------------------------------------------------------- running
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(model: torch.nn.Module, inputs: list[Any], device: torch.device) -> tuple[Any, float]:
    """One reference call on clones of ``inputs``: (outputs, wall seconds)."""
    args = _clone(inputs)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model(*args)
    _sync(device)
    return out, time.perf_counter() - start


def _operator_count(model: torch.nn.Module, inputs: list[Any]) -> int | None:
    """The number of non-view ATen operators one reference call on ``inputs`` runs, as the
    judge's :class:`~kerneljudge.worker.forward.OpRecorder` counts them (None: the call does
    not run under a dispatch mode, e.g. a reference that already uses one)."""
    args = _clone(inputs)
    try:
        with torch.no_grad(), OpRecorder() as recorder:
            model(*args)
    except Exception:  # a warning's measurement: never the reason a sound problem fails
        return None
    return recorder.count


def _input_names(model: torch.nn.Module, count: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(count)]
