"""The lint's checks after ``load``, one function each (see :mod:`kerneljudge.lint` for what
each proves), and the null candidates ``nulls_fail`` runs.

Each function takes the reference's model, inputs and outputs as
:func:`kerneljudge.lint.lint_problem` made them and returns one
:class:`~kerneljudge.lint.report.LintCheck`; one that raises is reported by the caller as a
failure of the check it was running.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.check import compare_outputs
from kerneljudge.errors import ProblemError
from kerneljudge.lint.report import LintCheck
from kerneljudge.lint.running import (
    _differs,
    _fmt_bytes,
    _fmt_s,
    _input_names,
    _map_tensors,
    _nbytes,
    _run,
    _tensors,
)
from kerneljudge.lint.shapes import check_output_shapes, traced_output_shapes
from kerneljudge.problem import Problem
from kerneljudge.timing import roofline

__all__ = [
    "LAUNCH_FLOOR_S",
    "MAGNITUDE_FACTOR",
    "MAX_BYTES_RATIO",
    "MAX_REFERENCE_OPS",
    "NOISE_FACTOR",
    "SMALL_SHAPE_TAGS",
]

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
    sets: list[str | None] = [s for s in problem.shape_sets if s != "tiny"] or [linted]
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
