"""What a worker makes of the code under test and its results, for the request handlers of
:mod:`kerneljudge.worker.runtime`: a failure as the candidate's own lines, the reference's
parameters loaded into ``ModelNew``, what a call did to its inputs, outputs as plain data for
the wire, the profiler's table, and the confinement around every call of code under test.

Imports only the standard library, torch and :mod:`kerneljudge.worker` modules.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import torch

from kerneljudge.worker import measure
from kerneljudge.worker.forward import Fault
from kerneljudge.worker.sandbox import (
    LOG_LIMIT_BYTES,
    Sandbox,
    child_pids,
    lingering_threads,
    thread_idents,
)

__all__ = [
    "Confined",
    "align_state_dict",
    "candidate_lineno",
    "call_copies",
    "candidate_traceback",
    "check_aftermath",
    "check_cpu_copyable",
    "input_effects",
    "layout",
    "nbytes",
    "profile_rows",
    "trial_fields",
]


def candidate_lineno(exc: BaseException, path: str | None) -> int | None:
    """The line of ``path`` (the candidate file) closest to where ``exc`` was raised; a syntax
    error's own line; None when neither is known."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if path and f.filename == path]
    if frames:
        return frames[-1].lineno
    return getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None


def candidate_traceback(exc: BaseException, path: str | None) -> str:
    """The exception with only the frames in the candidate file (all frames when none are),
    the last six, one line each."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path and f.filename == path]
    lines = [f"  line {f.lineno}: {(f.line or '').strip()}" for f in (mine or frames)[-6:]]
    head = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        head = f"the candidate wrote more than {LOG_LIMIT_BYTES >> 20} MiB of output ({head})"
    return "\n".join([head, *lines]) if lines else head


def check_cpu_copyable(value: Any) -> None:
    """Raise what :func:`kerneljudge.worker.forward.to_cpu` raises for ``value``, without
    copying it.

    Raises:
        Fault: a value (nested in lists and tuples) other than a tensor, None or a number.
    """
    if isinstance(value, (tuple, list)):
        for v in value:
            check_cpu_copyable(v)
    elif not (value is None or isinstance(value, (torch.Tensor, bool, int, float))):
        raise Fault(f"forward returned an unsupported {type(value).__name__}; return tensors")


def layout(values: Any) -> list[list[Any]]:
    """``[shape, dtype name]`` of each tensor in ``values`` (nested lists/tuples flattened)."""
    return [
        [list(t.shape), str(t.dtype).removeprefix("torch.")]
        for t in measure.flatten_tensors(values)
    ]


def nbytes(values: list[Any]) -> int:
    """Bytes held by the tensors among ``values`` (other values count nothing)."""
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def call_copies(inputs: list[Any], spares: dict[str, list[Any]] | None = None) -> list[Any]:
    """What one call of a model gets: a copy of each tensor of ``inputs`` (the call may write to
    its arguments), other values as they are. ``spares`` (a worker's spare tensors): the copies
    are written over those of its ``"args"`` entry where one can take them
    (:func:`~kerneljudge.worker.measure.writable`; a non-contiguous input is always cloned),
    and become that entry; on the CPU a fresh tensor of hundreds of MB costs its new pages on
    top of the copy (as for :func:`~kerneljudge.worker.measure.perturb`'s ``into``)."""
    spare = list(spares.get("args", ())) if spares is not None else []
    copies: list[Any] = []
    for i, x in enumerate(inputs):
        dest = measure.writable(spare[i] if i < len(spare) else None, x)
        if isinstance(x, torch.Tensor):
            x = dest.copy_(x) if dest is not None and x.is_contiguous() else x.clone()
        copies.append(x)
    if spares is not None:
        spares["args"] = copies
    return copies


def trial_fields(result: Any) -> dict[str, Any]:
    """A :class:`~kerneljudge.verdict.TrialResult` as plain data for the wire (its
    mismatches as ``[index, expected, got]``)."""
    fields = dataclasses.asdict(result)
    fields["mismatches"] = [[list(m.index), m.expected, m.got] for m in result.mismatches]
    return fields


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


def input_effects(args: list[Any], originals: list[Any], out: Any) -> dict[str, Any]:
    """Whether a call returned a view of an input, and which inputs it changed in place.

    Returns:
        ``aliases_input``: some output shares storage with one of ``args``;
        ``modified_inputs``: the indices of the tensors of ``args`` no longer equal
        (``torch.equal``) to their copies in ``originals``.
    """
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


def profile_rows(
    call: Callable[[list[Any]], Any],
    inputs: list[Any],
    calls: int,
    device: torch.device,
) -> list[dict[str, Any]]:
    """Run ``call`` on clones of ``inputs`` once, then ``calls`` times under torch.profiler.

    Args:
        call: makes one forward call on the arguments it is given (confined by the caller).
        inputs: the forward inputs; each profiled call gets its own clones, made before the
            profiled window.
        calls: the number of profiled calls, at least 1.
        device: the device the call runs on; CUDA rows are GPU kernels and copies.

    Returns:
        ``{name, device_time_ms, calls, share}`` per GPU kernel or copy (on CUDA) or per
        operator by self CPU time (on the CPU, where the forward's own Python and extension
        code is the row ``ModelNew.forward``); time and calls are per forward call, ``share``
        the fraction of all rows' time; largest first, at most 30 rows.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    n = calls
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    call(call_copies(inputs))
    batches = [call_copies(inputs) for _ in range(n)]  # cloned outside the profiled window
    with profile(activities=activities) as prof:
        for args in batches:
            with record_function("ModelNew.forward"):
                call(args)
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
    rows: list[dict[str, Any]] = [
        {"name": name, "device_time_ms": t / n / 1e3, "calls": c / n, "share": t / total_us}
        for name, (t, c) in totals.items()
    ]
    rows.sort(key=lambda r: -r["device_time_ms"])
    return rows[:30]


class SandboxOwner(Protocol):
    """What :class:`Confined` reads: the worker's sandbox (None in the reference worker)."""

    sandbox: Sandbox | None


def check_aftermath(sandbox: Sandbox | None, threads_before: set[int]) -> None:
    """Raise a rejecting Fault for threads or processes that outlived the call.

    Args:
        sandbox: the candidate worker's sandbox; None (the reference worker) checks nothing.
        threads_before: the thread idents (:func:`~kerneljudge.worker.sandbox.thread_idents`)
            alive before the call.

    Raises:
        Fault: ``rejected``: a thread started by the call is still running, or this process
            has a child process.
    """
    if sandbox is None:
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


class Confined:
    """Arms the sandbox around candidate code and turns what it caught into a rejecting Fault.

    The owner's ``sandbox`` is read on entry and on exit. Whatever the sandbox refused during the
    call is a rejecting Fault, whether the call raised or returned; otherwise a call that raised
    is left to the caller, and after one that returned, threads or processes it left behind are a
    rejecting Fault (:func:`check_aftermath`; the timed loop checks after each of its calls
    itself).
    """

    def __init__(self, worker: SandboxOwner) -> None:
        self.worker = worker
        self.before: set[int] = set()

    def __enter__(self) -> Confined:
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
            check_aftermath(self.worker.sandbox, self.before)
