"""How the judge looks at a forward call, stated once for the workers and the problem lint.

* :func:`float64_oracle`: the reference evaluated in float64, the ground truth of the
  ``oracle`` rule (:mod:`kerneljudge.check`). The reference worker computes it for every trial
  judged under that rule; the lint computes it for its ``nulls_fail`` check.
* :class:`OpRecorder`: the ATen operators a call dispatches. Their names feed the custom-kernel
  policy (:mod:`kerneljudge.candidate.policy`) in the workers; their count (views aside) feeds
  the lint's ``not_launch_bound`` check.
* :func:`continuous`: which inputs are continuous floating data and which are masks, ids or
  integer-valued (not reordered, scaled or nudged between timed calls, see
  :func:`kerneljudge.worker.perturbation.perturb`); :func:`nudgeable`: how each is changed.
  The implementation is the timed loop's own (:mod:`kerneljudge.worker.perturbation`), named
  here so that no second copy appears.

The linter imports this module, so what it vouches for is what the judge computes. Imports only
the standard library, torch and :mod:`kerneljudge.worker` modules, as a sandboxed worker may.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._python_dispatch

from kerneljudge.worker.measure import continuous, writable
from kerneljudge.worker.perturbation import Plan, plans

__all__ = [
    "Fault",
    "OpRecorder",
    "continuous",
    "float64_oracle",
    "nudgeable",
    "to_cpu",
    "to_device",
    "to_double",
]


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


def to_device(values: list[Any], device: torch.device) -> list[Any]:
    """``values`` with every tensor moved to ``device`` (other values as they are)."""
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def to_double(values: list[Any], into: list[Any] | None = None) -> list[Any]:
    """``values`` with every floating tensor converted to float64 (masks in a floating dtype
    included; integer, bool and float64 tensors and non-tensors as they are).

    ``into``: an earlier return value, whose float64 tensors are written over where one has
    the shape and device needed (it and the value contiguous) instead of new ones allocated,
    as :func:`kerneljudge.worker.measure.perturb` does with its ``into``: on the CPU a new
    float64 copy of hundreds of MB costs its fresh pages on top of the conversion.
    """
    spare = list(into or ())
    out: list[Any] = []
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.dtype == torch.float64:
            out.append(v)
            continue
        t = writable(spare[i] if i < len(spare) else None, v, torch.float64)
        if t is not None and v.is_contiguous():
            out.append(t.copy_(v))
        else:
            out.append(v.double())
    return out


def to_cpu(value: Any, keep_device: bool = False, own: bool = False) -> Any:
    """A detached CPU copy of an output: tensors copied, lists and tuples kept as such, None,
    bool, int and float as they are. With ``keep_device``, the copies stay on the tensors'
    own devices. With ``own`` (the worker's own copies, such as an audited timed call's kept
    outputs, whose digests the receiver checks), a plain CPU tensor is returned as it is, not
    copied (a copy of 128 MiB took 0.07 s on a 2-core host).

    A GPU tensor of at least :data:`PINNED_COPY_BYTES` is copied into page-locked host memory
    (torch's caching host allocator: the blocks are reused by later copies), which the device
    writes at full speed, where a copy into fresh pageable memory pays a page fault per page.

    Raises:
        Fault: any other type (a dict, a custom object): forward must return tensors.
    """
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if own and type(value) is torch.Tensor and t.device.type == "cpu":
            return t
        if keep_device or t.device.type == "cpu":
            return t.clone()
        return _host_copy(t)
    if isinstance(value, (tuple, list)):
        copies = (to_cpu(v, keep_device, own) for v in value)
        return list(copies) if isinstance(value, list) else tuple(copies)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise Fault(f"forward returned an unsupported {type(value).__name__}; return tensors")


#: :func:`to_cpu` of the worker's own copies (``own``): what sends kept timed outputs.
as_sent = functools.partial(to_cpu, own=True)


#: GPU tensors of at least this many bytes are copied to the host through page-locked memory.
PINNED_COPY_BYTES = 1 << 20


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of the device tensor ``t`` (same shape, dtype and strides where dense)."""
    if t.device.type == "cuda" and t.numel() * t.element_size() >= PINNED_COPY_BYTES:
        try:
            host = torch.empty_like(t, device="cpu", pin_memory=True)
        except RuntimeError:  # no page-locked memory to be had: a plain copy
            return t.to("cpu")
        host.copy_(t, non_blocking=True)
        torch.cuda.current_stream(t.device).synchronize()
        return host
    return t.to("cpu")


def float64_oracle(
    model: torch.nn.Module,
    inputs: list[Any],
    device: torch.device,
    keep: Callable[[Any], Any] | None = None,
    spare: list[Any] | None = None,
    tries_made: list[str] | None = None,
) -> Any:
    """The reference evaluated in float64: ``model`` called (under ``no_grad``) with its floating
    parameters and buffers in float64 (:func:`in_float64`) on ``inputs`` with every floating
    tensor upcast to float64 (:func:`to_double`).

    Tried on ``device``, then on the CPU when ``device`` is a GPU, unless the GPU's try failed
    on a dtype or device mismatch inside the model (a tensor it keeps outside its parameters and
    buffers): that would come again on the CPU, after minutes of float64 work there. ``model``
    is the same afterwards (its own tensors are put back; the float64 call ran on copies); an
    input tensor that needs no conversion (integer, bool or float64, already on the device of
    the try) is passed as it is, not copied. ``spare`` (a list this function fills): the
    float64 inputs of a try on the CPU are kept in it, and written over by the next call given
    the same list (:func:`to_double`'s ``into``). ``tries_made`` (a list this function fills):
    per try, ``"<device type> out of memory"`` (``torch.cuda.OutOfMemoryError``),
    ``"<device type> failed"`` or, for the one that succeeded, its device type.

    Returns:
        The outputs as ``keep`` copies them (default :func:`to_cpu`; float64 where the
        reference computes in it), or None when no try succeeded (float64 unsupported by the
        reference).

    Raises:
        Fault: the float64 call returned a type other than tensors, None or numbers.
    """
    tries = [device] if device.type == "cpu" else [device, torch.device("cpu")]
    made = tries_made if tries_made is not None else []
    for dev in tries:
        try:
            with in_float64(model, dev):
                moved = to_device(inputs, dev)
                reused = spare if dev.type == "cpu" else None
                args = to_double(moved, into=reused)
                if reused is not None:  # the converted ones only
                    reused[:] = [a if a is not v else None for a, v in zip(args, moved)]
                with torch.no_grad():
                    result = (keep or to_cpu)(model(*args))
                made.append(dev.type)
                return result
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            oom = isinstance(exc, torch.cuda.OutOfMemoryError)
            made.append(f"{dev.type} {'out of memory' if oom else 'failed'}")
            if _mismatch(exc):
                return None
    return None


#: Words of torch's errors for operands of different dtypes or devices.
_MISMATCH_WORDS = (
    "same dtype",
    "expected scalar type",
    "dtype mismatch",
    "same device",
    "expected all tensors to be on the same device",
)


def _mismatch(exc: BaseException) -> bool:
    """Whether a failed float64 call failed on a dtype or device mismatch of its operands."""
    text = str(exc).lower()
    return any(words in text for words in _MISMATCH_WORDS)


@contextlib.contextmanager
def in_float64(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """``model`` with each parameter's data and each buffer moved to ``device``, floating ones
    in float64, inside the ``with`` block; the original tensors are put back at its end (the
    same objects: nothing is converted back). The float64 tensors are copies, also where a
    tensor is float64 already.

    The module itself is changed, not a copy: code that refers to its submodules from
    elsewhere (a ``lambda`` attribute over ``self.mlp``, as some reference models have) sees
    the float64 tensors too, where a ``copy.deepcopy`` would have left it the originals. Tied
    parameters and buffers registered twice are converted once.
    """
    done: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        # Keyed by the id of a tensor the lists below keep alive: no id is reused meanwhile.
        if id(t) not in done:
            dtype = torch.float64 if t.is_floating_point() else t.dtype
            # Always a copy: what the float64 call changes in place stays out of the model.
            done[id(t)] = t.detach().to(device=device, dtype=dtype, copy=True)
        return done[id(t)]

    params: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    buffers: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    try:
        for p in model.parameters():  # each Parameter once
            data = p.data
            params.append((p, data))
            p.data = convert(data)
        for module in model.modules():
            for name, b in list(module._buffers.items()):
                if b is not None:
                    buffers.append((module._buffers, name, b))
                    module._buffers[name] = convert(b)
        yield
    finally:
        for p, data in reversed(params):
            p.data = data
        for table, name, b in reversed(buffers):
            table[name] = b


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen operators dispatched inside it (``with OpRecorder() as rec: ...``).

    Attributes:
        ops: the operators' names (``mm``, ``_softmax``, ...; overloads merged), views included.
        count: the number of operators dispatched, views (which launch nothing) left out.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def nudgeable(values: list[Any]) -> list[Plan | None]:
    """Per value, how the timed loop changes it between calls: a
    :class:`~kerneljudge.worker.perturbation.Plan` for a :func:`continuous` tensor (from its
    values' structure), None for anything else (:func:`kerneljudge.worker.perturbation.plans`)."""
    return plans(values)
