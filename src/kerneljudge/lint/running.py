"""How the lint runs the reference and reads its results: one call (timed), the operators it
dispatches (counted by the judge's own recorder, :mod:`kerneljudge.worker.forward`), the
forward's argument names, tensors compared bit for bit or within a tolerance, sizes and times
as text; the cap on the memory the checks may take on the CPU (:func:`memory_cap`).
"""

from __future__ import annotations

import contextlib
import inspect
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kerneljudge.check import flatten_outputs
from kerneljudge.check.memory import available_bytes
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


# ----------------------------------------------------------------------------- memory
#: Share of the host's available memory the checks of one problem may take on the CPU.
MEMORY_SHARE = 0.75


def _data_bytes() -> int | None:
    """This process's ``VmData`` (bytes: what ``RLIMIT_DATA`` counts); None if unreadable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextlib.contextmanager
def memory_cap(device: torch.device) -> Iterator[int | None]:
    """On the CPU, cap this process's private writable memory (the soft ``RLIMIT_DATA``) at
    what it holds now plus :data:`MEMORY_SHARE` of the host's available memory
    (:func:`kerneljudge.check.memory.available_bytes`) while the block runs, so that a problem
    whose checks would not fit gets an allocation error (:func:`out_of_memory`) instead of the
    host's out-of-memory killer ending this process. The old limit comes back at the end; a
    lower one already set is kept. Yields the bytes the block may add (None: no cap, on a GPU
    or where the memory cannot be read)."""
    held, free = _data_bytes(), available_bytes()
    if device.type != "cpu" or held is None or free is None:
        yield None
        return
    room = int(free * MEMORY_SHARE)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = held + room
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield None
        return
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    try:
        yield room
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed (``MemoryError``, torch's allocator)."""
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)


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
