"""Problem lint: prove that a reference is sound before anyone is judged against it.

Public kernel suites lost a sixth of their tasks to degenerate references: outputs so small that
returning zeros passed, outputs that ignored the inputs, problems so small that launch overhead
was the whole time. :func:`lint_problem` runs one problem's reference at one shape set and
checks, in order:

``load``             the file imports, the shape set exists, the model builds, the reference runs.
``metadata``         public and held-out shape sets, ``flop_count``/``byte_count``, a known
                     ``DTYPE`` that some input or output has (required for bundled problems, a
                     warning for external ones).
``output_shape``     the output's shape follows from the inputs' at every shape set: as the
                     problem's ``output_shape()`` says, else by a rule that holds across the
                     sets (see :mod:`kerneljudge.lint.shapes`); n/a with one set.
``finite``           no NaN or infinity in the output.
``deterministic``    two runs on the same inputs give bit-identical outputs.
``inputs_unchanged`` the reference does not write into its inputs.
``magnitude``        every floating output's mean ``|y|`` is at least ``MAGNITUDE_FACTOR`` times
                     the absolute tolerance.
``nulls_fail``       null candidates fail the correctness check under both rules of
                     :func:`kerneljudge.check.compare_outputs` (``"oracle"`` and ``"allclose"``):
                     zeros, a constant, the mean of the reference output, the first input passed
                     through, and the reference plus noise of ``NOISE_FACTOR`` times the
                     tolerance. A null equal to the reference by construction is no alarm: the
                     mean of a one-element output (a loss) is that output, so the mean null is
                     left out when every output has at most one element.
``inputs_matter``    another seed changes the output, and so does replacing each input alone.
``weights_matter``   perturbing each parameter (and floating buffer) changes the output.
``weights_vary``     (a warning) no parameter or floating buffer of more than one element is
                     constant, as a default LayerNorm's ones and zeros are: a candidate that
                     ignores such a weight passes.
``counts``           ``flop_count``/``byte_count`` are positive and plausible; on a GPU with a
                     datasheet entry the reference is not faster than the floor they imply.
``fits``             the reference's wall time, its input + output + parameter bytes and (on
                     CUDA) its peak allocated memory stay within :class:`LintLimits`.
``not_launch_bound`` (a warning) at every shape set but ``tiny``, the H100 time floor is at
                     least ``LAUNCH_FLOOR_S``, unless the problem is tagged ``decode`` or
                     ``small-shape``; and one reference call at the linted set runs at most
                     ``MAX_REFERENCE_OPS`` operators (a Python loop over a sequence makes
                     the reference's time launch overhead, and torch.compile unrolls it; this
                     half applies to ``decode`` problems too).

A problem that fails to load is a failed report, never an exception. The lint runs the reference
in this process: only lint code you would import.
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kerneljudge.check import compare_outputs, flatten_outputs
from kerneljudge.errors import ProblemError
from kerneljudge.lint.shapes import check_output_shapes, traced_output_shapes
from kerneljudge.problem import Problem, bundled_problem_names, bundled_problems_dir
from kerneljudge.timing import roofline

__all__ = [
    "CHECK_NAMES",
    "LAUNCH_FLOOR_S",
    "MAGNITUDE_FACTOR",
    "MAX_REFERENCE_OPS",
    "NOISE_FACTOR",
    "LintCheck",
    "LintLimits",
    "LintReport",
    "discover_problem_files",
    "lint_paths",
    "lint_problem",
]

CHECK_NAMES = (
    "load",
    "metadata",
    "output_shape",
    "finite",
    "deterministic",
    "inputs_unchanged",
    "magnitude",
    "nulls_fail",
    "inputs_matter",
    "weights_matter",
    "weights_vary",
    "counts",
    "fits",
    "not_launch_bound",
)
#: Floating outputs must have mean |y| >= MAGNITUDE_FACTOR * atol.
MAGNITUDE_FACTOR = 10.0
#: The noisy null candidate is off by NOISE_FACTOR * (atol + rtol * |y|) at every element.
NOISE_FACTOR = 10.0
#: Below this H100 time floor (seconds) a problem measures launch overhead, not its kernel.
LAUNCH_FLOOR_S = 10e-6
#: More (non-view) ATen operators than this in one reference call: its time on a GPU is launch
#: overhead, and torch.compile has that many nodes to trace. Measured on the H200 (eager, public
#: shapes; docs/benchmarks/2026-11-30-h200-validation.md): ``causal_gqa``'s naive per-position
#: attention runs 801 operators in 8.85 ms, 11 us each; the former ``selective_scan`` loop over
#: 2,048 time steps 16,394 in 231 ms, 14 us each, and did not compile in 290 s.
MAX_REFERENCE_OPS = 2000
#: Tags that exempt a problem from ``not_launch_bound``: small by design.
SMALL_SHAPE_TAGS = ("decode", "small-shape")
#: A byte count above this multiple of the inputs + outputs + parameters is implausible.
MAX_BYTES_RATIO = 4.0
_SEED_A, _SEED_B, _NOISE_SEED = 0, 1, 1234
_MAX_SEPARATE_WEIGHTS = 32


@dataclass(frozen=True)
class LintLimits:
    """What the reference may use at the linted shape set.

    Attributes:
        time_s: wall time of one reference call, seconds.
        memory_bytes: inputs + outputs + parameters, bytes: what a candidate must hold too.
        peak_memory_bytes: on CUDA, the peak memory allocated during one reference call
            (intermediates included), bytes. 16 GiB is a fifth of an 80 GB H100, so the
            reference, its float64 oracle and a candidate fit on one card side by side.
    """

    time_s: float = 10.0
    memory_bytes: int = 4 * 1024**3
    peak_memory_bytes: int = 16 * 1024**3


@dataclass(frozen=True)
class LintCheck:
    """The outcome of one check.

    Attributes:
        name: one of :data:`CHECK_NAMES`.
        passed: the check holds (also True when it was skipped).
        detail: what was measured, or why it failed; ``"n/a: ..."`` when skipped.
        required: a failure fails the report; False makes it a warning.
        skipped: the check does not apply (e.g. weights of a model without parameters).
    """

    name: str
    passed: bool
    detail: str = ""
    required: bool = True
    skipped: bool = False


@dataclass(frozen=True)
class LintReport:
    """The lint of one problem at one shape set.

    Attributes:
        problem: the problem's name (the spec, when it did not load).
        path: the problem file ("" when it was not found).
        shape_set: the linted shape set; None for a file without ``SHAPE_SETS``.
        device: the device the reference ran on.
        checks: one :class:`LintCheck` per check run, in :data:`CHECK_NAMES` order.
        duration_s: wall time of the whole lint, seconds.
    """

    problem: str
    path: str
    shape_set: str | None
    device: str
    checks: tuple[LintCheck, ...]
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Every required check passed."""
        return all(c.passed or not c.required for c in self.checks)

    @property
    def failures(self) -> list[LintCheck]:
        """Required checks that failed."""
        return [c for c in self.checks if c.required and not c.passed]

    @property
    def warnings(self) -> list[LintCheck]:
        """Optional checks that failed."""
        return [c for c in self.checks if not c.required and not c.passed]

    def check(self, name: str) -> LintCheck | None:
        """The check called ``name``, or None when it did not run."""
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``passed`` added."""
        return {**asdict(self), "passed": self.passed}


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


class _OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it, views (which launch nothing) aside."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _operator_count(model: torch.nn.Module, inputs: list[Any]) -> int | None:
    """The number of non-view ATen operators one reference call on ``inputs`` runs (None: the
    call does not run under a dispatch mode, e.g. a reference that already uses one)."""
    args = _clone(inputs)
    try:
        with torch.no_grad(), _OperatorCount() as counter:
            model(*args)
    except Exception:  # a warning's measurement: never the reason a sound problem fails
        return None
    return counter.count


def _oracle(model: torch.nn.Module, inputs: list[Any], device: torch.device) -> Any:
    """The reference in float64 (floating inputs upcast), as the judge's worker evaluates it.

    On ``device``, else on the CPU; None when float64 is unsupported by the reference.
    """
    for dev in dict.fromkeys([device, torch.device("cpu")]):
        try:
            model64 = copy.deepcopy(model).to(dev).double()
            args = [
                v.to(dev).double()
                if isinstance(v, torch.Tensor) and v.is_floating_point()
                else v.to(dev)
                if isinstance(v, torch.Tensor)
                else v
                for v in inputs
            ]
            with torch.no_grad():
                return _map_tensors(model64(*args), lambda t: t.detach().cpu())
        except (RuntimeError, NotImplementedError, TypeError):
            continue
    return None


def _input_names(model: torch.nn.Module, count: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"input {i}" for i in range(count)]


# ----------------------------------------------------------------------------- null candidates
def _null_candidates(outputs: Any, inputs: list[Any], atol: float, rtol: float) -> dict[str, Any]:
    """Outputs a degenerate candidate would return; None where one does not apply."""

    def fill(value: Callable[[torch.Tensor], float]) -> Callable[[torch.Tensor], torch.Tensor]:
        def make(t: torch.Tensor) -> torch.Tensor:
            v = value(t)
            if not t.is_floating_point():
                v = round(v)
            return torch.full(t.shape, v, dtype=torch.float64).to(t.dtype)

        return make

    gen = torch.Generator().manual_seed(_NOISE_SEED)

    def noisy(t: torch.Tensor) -> torch.Tensor:
        if not t.is_floating_point():
            return t + 1
        y = t.cpu().double()
        sign = torch.randint(0, 2, y.shape, generator=gen, dtype=torch.float64) * 2 - 1
        return (y + sign * NOISE_FACTOR * (atol + rtol * y.abs())).to(t.dtype)

    first = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    passthrough = None
    if first is not None and any(t.numel() == first.numel() for t in _tensors(outputs)):
        passthrough = _map_tensors(
            outputs,
            lambda t: first.cpu().reshape(t.shape).to(t.dtype) if t.numel() == first.numel() else t,
        )
    mean = lambda t: float(t.cpu().double().mean()) if t.numel() else 0.0  # noqa: E731
    # The mean of a one-element output is the output itself: that null is the reference.
    summarised = any(t.numel() > 1 for t in _tensors(outputs))
    return {
        "zeros": _map_tensors(outputs, fill(lambda t: 0.0)),
        "constant": _map_tensors(outputs, fill(lambda t: 1.0)),
        "mean": _map_tensors(outputs, fill(mean)) if summarised else None,
        "first_input": passthrough,
        "noise": _map_tensors(outputs, noisy),
    }


# ----------------------------------------------------------------------------- the checks
def _check_metadata(problem: Problem, inputs: list[Any], outputs: Any, required: bool) -> LintCheck:
    issues = []
    if not problem.description:
        issues.append("no DESCRIPTION")
    sets = problem.shape_sets
    if "public" not in sets:
        issues.append("no 'public' shape set")
    if not [s for s in sets if s not in ("public", "tiny")]:
        issues.append("no held-out shape set")
    for fn in ("flop_count", "byte_count"):
        if not callable(getattr(problem.module, fn, None)):
            issues.append(f"no {fn}()")
    try:
        dtype = problem.dtype
        floats = {t.dtype for t in _tensors(inputs) + _tensors(outputs) if t.is_floating_point()}
        if floats and dtype not in floats:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in floats))
            issues.append(
                f"DTYPE is {str(dtype).removeprefix('torch.')}, but no input or "
                f"output is (they are {names})"
            )
    except ProblemError as exc:
        issues.append(str(exc))
    unknown = set(getattr(problem.module, "TOLERANCE", {}) or {}) - {"atol", "rtol"}
    if unknown:
        issues.append(f"TOLERANCE has unknown keys {sorted(unknown)}")
    return LintCheck("metadata", not issues, "; ".join(issues) or "complete", required=required)


def _check_output_shape(problem: Problem, linted: str | None, outputs: Any) -> LintCheck:
    try:
        traced = traced_output_shapes(problem, {linted or "public": outputs})
        passed, detail = check_output_shapes(problem, traced)
    except Exception as exc:  # noqa: BLE001 - problem code; a failure here is the check's
        return LintCheck("output_shape", False, f"raised {type(exc).__name__}: {exc}")
    if passed is None:
        return LintCheck("output_shape", True, detail, skipped=True)
    return LintCheck("output_shape", passed, detail)


def _check_magnitude(outputs: Any, atol: float) -> LintCheck:
    floats = [t for t in _tensors(outputs) if t.is_floating_point() and t.numel()]
    if not floats:
        return LintCheck("magnitude", True, "n/a: no floating output", skipped=True)
    means = [float(t.cpu().double().abs().mean()) for t in floats]
    worst = min(range(len(means)), key=lambda i: means[i])
    ratio = means[worst] / atol if atol > 0 else math.inf
    label = f"output {worst}" if len(floats) > 1 else "output"
    detail = f"{label}: mean |y| = {means[worst]:.3g} = {ratio:.3g} x atol ({atol:g})"
    return LintCheck(
        "magnitude",
        ratio >= MAGNITUDE_FACTOR,
        detail + ("" if ratio >= MAGNITUDE_FACTOR else f", below {MAGNITUDE_FACTOR:g} x atol"),
    )


def _check_nulls(
    outputs: Any, oracle: Any, inputs: list[Any], atol: float, rtol: float
) -> LintCheck:
    passing = []
    for name, candidate in _null_candidates(outputs, inputs, atol, rtol).items():
        if candidate is None:
            continue
        for mode in ("oracle", "allclose"):
            result = compare_outputs(
                outputs, candidate, oracle=oracle, atol=atol, rtol=rtol, mode=mode
            )
            if result.passed:
                passing.append(f"{name} passes under {mode}")
    note = "" if oracle is not None else " (no float64 oracle: oracle mode fell back)"
    if passing:
        return LintCheck("nulls_fail", False, "; ".join(passing) + note)
    return LintCheck("nulls_fail", True, "all null candidates fail" + note)


def _check_inputs(
    model: torch.nn.Module,
    problem: Problem,
    inputs: list[Any],
    outputs: Any,
    device: torch.device,
    atol: float,
    rtol: float,
) -> LintCheck:
    other = problem.make_inputs(_SEED_B, device)
    out_b, _ = _run(model, other, device)
    if not _differs(outputs, out_b, atol, rtol):
        return LintCheck(
            "inputs_matter", False, f"seeds {_SEED_A} and {_SEED_B} give the same output"
        )
    names = _input_names(model, len(inputs))
    dead = []
    for i, (mine, theirs) in enumerate(zip(inputs, other)):
        if not isinstance(mine, torch.Tensor):
            continue
        mixed = list(inputs)
        mixed[i] = theirs
        try:
            out_i, _ = _run(model, mixed, device)
        except Exception as exc:  # the reference is user code: report, do not crash
            return LintCheck(
                "inputs_matter",
                False,
                f"{names[i]} from seed {_SEED_B} raised {type(exc).__name__}: {exc}",
            )
        if not _differs(outputs, out_i, atol, rtol):
            dead.append(names[i])
    if dead:
        return LintCheck("inputs_matter", False, f"output ignores {', '.join(dead)}")
    count = sum(isinstance(x, torch.Tensor) for x in inputs)
    return LintCheck("inputs_matter", True, f"another seed and each of {count} inputs matter")


def _check_weights(
    model: torch.nn.Module,
    inputs: list[Any],
    outputs: Any,
    device: torch.device,
    atol: float,
    rtol: float,
) -> LintCheck:
    named = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b.is_floating_point()
    ]
    if not named:
        return LintCheck("weights_matter", True, "n/a: no parameters", skipped=True)
    gen = torch.Generator().manual_seed(_NOISE_SEED)
    groups = [[item] for item in named] if len(named) <= _MAX_SEPARATE_WEIGHTS else [named]
    dead = []
    for group in groups:
        saved = [t.detach().clone() for _, t in group]
        with torch.no_grad():
            for _, t in group:
                rms = float(t.detach().cpu().double().pow(2).mean().sqrt()) if t.numel() else 0.0
                delta = torch.randn(t.shape, generator=gen) * (0.5 * rms + 0.1)
                t.add_(delta.to(device=t.device, dtype=t.dtype))
        try:
            out_w, _ = _run(model, inputs, device)
        finally:
            with torch.no_grad():
                for (_, t), s in zip(group, saved):
                    t.copy_(s)
        if not _differs(outputs, out_w, atol, rtol):
            dead.append(", ".join(n for n, _ in group) if len(group) == 1 else "all jointly")
    how = "each" if len(groups) > 1 or len(named) == 1 else "jointly"
    if dead:
        return LintCheck("weights_matter", False, f"output ignores {'; '.join(dead)}")
    return LintCheck("weights_matter", True, f"{len(named)} weight tensors matter ({how})")


def _check_weights_vary(model: torch.nn.Module) -> LintCheck:
    named = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b.is_floating_point()
    ]
    if not named:
        return LintCheck("weights_vary", True, "n/a: no parameters", required=False, skipped=True)
    constant = []
    for name, t in named:
        flat = t.detach().flatten()
        if flat.numel() > 1 and bool((flat == flat[0]).all()):
            constant.append(f"{name} (all {float(flat[0]):g})")
    if constant:
        return LintCheck(
            "weights_vary",
            False,
            "constant: " + ", ".join(constant) + "; a candidate that ignores them passes",
            required=False,
        )
    return LintCheck("weights_vary", True, f"{len(named)} weight tensors vary", required=False)


def _check_counts(
    problem: Problem,
    inputs: list[Any],
    outputs: Any,
    params_bytes: int,
    time_s: float,
    device: torch.device,
) -> LintCheck:
    has_flops = callable(getattr(problem.module, "flop_count", None))
    has_bytes = callable(getattr(problem.module, "byte_count", None))
    if not (has_flops or has_bytes):
        return LintCheck("counts", True, "n/a: no flop_count/byte_count", skipped=True)
    flops = problem.flop_count() if has_flops else None
    nbytes = problem.byte_count() if has_bytes else None
    issues = [
        f"{label} = {v!r}"
        for label, v in (("flop_count()", flops), ("byte_count()", nbytes))
        if v is not None and not (math.isfinite(v) and v > 0)
    ]
    moved = _nbytes(inputs) + _nbytes(outputs) + params_bytes
    if nbytes is not None and not issues:
        if nbytes < _nbytes(outputs):
            issues.append(
                f"byte_count() {_fmt_bytes(nbytes)} is less than the outputs "
                f"({_fmt_bytes(_nbytes(outputs))})"
            )
        elif nbytes > MAX_BYTES_RATIO * moved:
            issues.append(
                f"byte_count() {_fmt_bytes(nbytes)} exceeds {MAX_BYTES_RATIO:g} x "
                f"inputs + outputs + parameters ({_fmt_bytes(moved)})"
            )
    detail = f"{flops or 0:.3g} FLOP, {_fmt_bytes(nbytes or 0)}"
    spec = roofline.spec_for_device(device) if device.type == "cuda" else None
    if spec is not None and not spec.measured and not issues:
        floor = roofline.floor_s(flops, nbytes, spec, roofline.compute_dtype(problem))
        if time_s < roofline.FLOOR_MARGIN * floor:
            issues.append(
                f"the reference took {_fmt_s(time_s)}, below the {spec.name} floor "
                f"{_fmt_s(floor)} the counts imply: they overstate the work"
            )
        detail += f", {spec.name} floor {_fmt_s(floor)}"
    return LintCheck("counts", not issues, "; ".join(issues) or detail)


def _check_launch_bound(problem: Problem, linted: str | None, operators: int | None) -> LintCheck:
    """The H100 floor at every non-``tiny`` set, and ``operators`` (one call at ``linted``)."""
    many = (
        f"{operators} operators in one reference call at {linted or 'module'} (more than "
        f"{MAX_REFERENCE_OPS}: its GPU time is launch overhead, and torch.compile traces "
        "every one; a Python loop over a long dimension?)"
        if operators is not None and operators > MAX_REFERENCE_OPS
        else ""
    )
    counted = (
        f"{operators} operators per call" if operators is not None else "operators not counted"
    )
    has = [callable(getattr(problem.module, f, None)) for f in ("flop_count", "byte_count")]
    exempt = [t for t in problem.tags if t in SMALL_SHAPE_TAGS]
    if not any(has) or exempt:
        why = f"tagged {exempt[0]!r}" if exempt else "no counts"
        if many:
            return LintCheck("not_launch_bound", False, many, required=False)
        return LintCheck(
            "not_launch_bound",
            True,
            f"n/a: {why} (floor not checked); {counted}",
            required=False,
            skipped=True,
        )
    h100 = roofline.DEVICES["NVIDIA H100 SXM5 80GB"]
    dtype = roofline.compute_dtype(problem)
    sets = [s for s in problem.shape_sets if s != "tiny"] or [linted]
    small = []
    try:
        for name in sets:
            if name is not None:
                problem.use_shape_set(name)
            flops = problem.flop_count() if has[0] else None
            nbytes = problem.byte_count() if has[1] else None
            floor = roofline.floor_s(flops, nbytes, h100, dtype)
            if floor < LAUNCH_FLOOR_S:
                small.append(f"{name or 'module'} ({_fmt_s(floor)})")
    finally:
        if linted is not None:
            problem.use_shape_set(linted)
    issues = [f"H100 floor under {_fmt_s(LAUNCH_FLOOR_S)} at " + ", ".join(small)] if small else []
    issues += [many] if many else []
    if issues:
        return LintCheck("not_launch_bound", False, "; ".join(issues), required=False)
    return LintCheck(
        "not_launch_bound",
        True,
        f"H100 floor >= {_fmt_s(LAUNCH_FLOOR_S)} at {len(sets)} shape sets, {counted}",
        required=False,
    )


# ----------------------------------------------------------------------------- entry points
def _default_shape_set(problem: Problem) -> str | None:
    """``"tiny"`` when the problem has it, else the set with the smallest product of integer
    shape globals, else None (no shape sets)."""
    sets = problem.shape_sets
    if not sets:
        return None
    if "tiny" in sets:
        return "tiny"

    def size(name: str) -> float:
        problem.use_shape_set(name)
        ints = [
            v
            for v in problem.shape_globals().values()
            if isinstance(v, int) and not isinstance(v, bool)
        ]
        return math.prod(max(v, 1) for v in ints)

    return min(sets, key=size)


def lint_problem(
    path_or_name: str | Path,
    shape_set: str | None = None,
    device: str | torch.device = "cpu",
    limits: LintLimits | None = None,
) -> LintReport:
    """Lint one problem (bundled name or file path) at one shape set.

    Args:
        path_or_name: a bundled problem name or the path of a KernelBench-format file.
        shape_set: the shape set to run; None picks ``"tiny"``, else the smallest set.
        device: where the reference runs (``"cpu"`` or ``"cuda[:i]"``).
        limits: time and memory limits for ``fits`` (default :class:`LintLimits`).

    Returns:
        A :class:`LintReport`; a problem that does not load or whose reference raises gives a
        report whose ``load`` check failed.
    """
    started = time.perf_counter()
    limits = limits or LintLimits()
    dev = torch.device(device)
    checks: list[LintCheck] = []
    name, path, linted = str(path_or_name), "", shape_set

    def report() -> LintReport:
        return LintReport(
            name, path, linted, str(dev), tuple(checks), time.perf_counter() - started
        )

    try:
        problem = Problem.load(path_or_name)
        name, path = problem.name, str(problem.path)
        linted = shape_set if shape_set is not None else _default_shape_set(problem)
        if linted is not None:
            problem.use_shape_set(linted)
        atol, rtol = problem.tolerance
        model = problem.make_model(_SEED_A).to(dev)
        inputs = problem.make_inputs(_SEED_A, dev)
        pristine = _clone(inputs)
        if _nbytes(inputs) > limits.memory_bytes:
            checks.append(LintCheck("load", True, "inputs built"))
            checks.append(
                LintCheck(
                    "fits",
                    False,
                    f"inputs alone take {_fmt_bytes(_nbytes(inputs))}, over the limit of "
                    f"{_fmt_bytes(limits.memory_bytes)}; other checks skipped",
                )
            )
            return report()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        args = _clone(inputs)
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model(*args)
        _sync(dev)
        time_a = time.perf_counter() - t0
    except ProblemError as exc:
        checks.append(LintCheck("load", False, str(exc)))
        return report()
    except Exception as exc:  # user code: a broken problem is a failed report, not a crash
        checks.append(LintCheck("load", False, f"{type(exc).__name__}: {exc}"))
        return report()
    checks.append(LintCheck("load", True, f"{len(inputs)} inputs, {len(_tensors(out))} outputs"))
    bundled = problem.path.parent == bundled_problems_dir().resolve()
    checks.append(_check_metadata(problem, inputs, out, required=bundled))
    checks.append(_check_output_shape(problem, linted, out))

    params_bytes = _nbytes(list(model.parameters()) + list(model.buffers()))
    moved = _nbytes(inputs) + _nbytes(out) + params_bytes
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else moved
    peak_limit = limits.peak_memory_bytes if dev.type == "cuda" else limits.memory_bytes
    if time_a > limits.time_s or moved > limits.memory_bytes or peak > peak_limit:
        checks.append(
            LintCheck(
                "fits",
                False,
                f"{_fmt_s(time_a)} (limit {_fmt_s(limits.time_s)})"
                f", {_fmt_bytes(moved)} moved (limit {_fmt_bytes(limits.memory_bytes)})"
                f", {_fmt_bytes(peak)} peak (limit {_fmt_bytes(peak_limit)});"
                " other checks skipped",
            )
        )
        return report()

    try:
        finite = all(
            bool(torch.isfinite(t.cpu().double()).all())
            for t in _tensors(out)
            if t.is_floating_point()
        )
        checks.append(LintCheck("finite", finite, "all finite" if finite else "NaN or inf"))
        out_again, time_b = _run(model, inputs, dev)
        same = _identical(out, out_again)
        checks.append(
            LintCheck(
                "deterministic",
                same,
                "bit-identical over two runs" if same else "two runs on the same inputs differ",
            )
        )
        intact = _identical(args, pristine)
        checks.append(
            LintCheck(
                "inputs_unchanged",
                intact,
                "inputs intact" if intact else "the reference writes into its inputs",
            )
        )
        checks.append(_check_magnitude(out, atol))
        oracle = _oracle(model, inputs, dev)
        checks.append(_check_nulls(out, oracle, inputs, atol, rtol))
        checks.append(_check_inputs(model, problem, inputs, out, dev, atol, rtol))
        checks.append(_check_weights(model, inputs, out, dev, atol, rtol))
        checks.append(_check_weights_vary(model))
        time_s = min(time_a, time_b)
        checks.append(_check_counts(problem, inputs, out, params_bytes, time_s, dev))
        checks.append(
            LintCheck(
                "fits",
                True,
                f"{_fmt_s(time_s)}, {_fmt_bytes(moved)} moved, {_fmt_bytes(peak)} peak",
            )
        )
        checks.append(_check_launch_bound(problem, linted, _operator_count(model, inputs)))
    except Exception as exc:  # user code again: report which check it broke
        done = {c.name for c in checks}
        broken = next(n for n in CHECK_NAMES if n not in done)
        checks.append(LintCheck(broken, False, f"raised {type(exc).__name__}: {exc}"))
    return report()


_DEFINES = [
    re.compile(p, re.MULTILINE)
    for p in (r"^class\s+Model\b", r"^def\s+get_inputs\b", r"^def\s+get_init_inputs\b")
]


def discover_problem_files(folder: str | Path) -> list[Path]:
    """The ``*.py`` files under ``folder`` (recursively, sorted) that define ``Model``,
    ``get_inputs`` and ``get_init_inputs`` at top level; hidden folders and files starting with
    ``_`` are skipped. Files are read, not imported."""
    found = []
    for path in sorted(Path(folder).rglob("*.py")):
        rel = path.relative_to(folder)
        if any(part.startswith((".", "_")) for part in rel.parts):
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if all(p.search(text) for p in _DEFINES):
            found.append(path)
    return found


def lint_paths(
    specs: list[str],
    shape_set: str | None = None,
    device: str | torch.device = "cpu",
    limits: LintLimits | None = None,
    progress: Callable[[LintReport], None] | None = None,
) -> list[LintReport]:
    """Lint every problem the specs name, one report each.

    Args:
        specs: bundled names, ``.py`` files or folders (every problem file under a folder, see
            :func:`discover_problem_files`); empty means every bundled problem.
        shape_set, device, limits: as for :func:`lint_problem`.
        progress: called with each report as soon as it is made.
    """
    targets: list[str | Path] = []
    for spec in specs or bundled_problem_names():
        path = Path(spec)
        targets.extend(discover_problem_files(path) if path.is_dir() else [spec])
    reports = []
    for target in targets:
        reports.append(lint_problem(target, shape_set=shape_set, device=device, limits=limits))
        if progress is not None:
            progress(reports[-1])
    return reports
