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
                     CUDA) its peak allocated memory stay within :class:`LintLimits`; on the
                     CPU the checks fit in three quarters of the host's available memory
                     (:func:`~kerneljudge.lint.running.memory_cap`).
``not_launch_bound`` (a warning) at every shape set but ``tiny``, the H100 time floor is at
                     least ``LAUNCH_FLOOR_S``, unless the problem is tagged ``decode`` or
                     ``small-shape``; and one reference call at the linted set runs at most
                     ``MAX_REFERENCE_OPS`` operators (a Python loop over a sequence makes
                     the reference's time launch overhead, and torch.compile unrolls it; this
                     half applies to ``decode`` problems too).

A problem that fails to load is a failed report, never an exception. The lint runs the reference
in this process: only lint code you would import.

The float64 oracle (``nulls_fail``) and the operator recorder (``not_launch_bound``) are the
judge's own (:mod:`kerneljudge.worker.forward`), so the lint vouches for what the judge computes.
The package: :func:`lint_problem` and the entry points here, the results in
:mod:`~kerneljudge.lint.report`, the checks in :mod:`~kerneljudge.lint.checks` and
:mod:`~kerneljudge.lint.shapes`, running the reference in :mod:`~kerneljudge.lint.running`, the
command in :mod:`~kerneljudge.lint.cli`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kerneljudge.errors import ProblemError
from kerneljudge.lint.checks import (
    _SEED_A,
    LAUNCH_FLOOR_S,
    MAGNITUDE_FACTOR,
    MAX_REFERENCE_OPS,
    NOISE_FACTOR,
    _check_counts,
    _check_inputs,
    _check_launch_bound,
    _check_magnitude,
    _check_metadata,
    _check_nulls,
    _check_output_shape,
    _check_weights,
    _check_weights_vary,
)
from kerneljudge.lint.report import CHECK_NAMES, LintCheck, LintLimits, LintReport
from kerneljudge.lint.running import (
    _clone,
    _fmt_bytes,
    _fmt_s,
    _identical,
    _nbytes,
    _operator_count,
    _run,
    _sync,
    _tensors,
    memory_cap,
    out_of_memory,
)
from kerneljudge.problem import Problem, bundled_problem_names, bundled_problems_dir
from kerneljudge.worker.forward import float64_oracle

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
        report whose ``load`` check failed. On the CPU the checks may take at most three
        quarters of the host's available memory (:func:`~kerneljudge.lint.running.memory_cap`;
        the process's ``RLIMIT_DATA`` is lowered meanwhile): a problem whose checks need more
        fails ``fits``, the checks after it skipped.
    """
    dev = torch.device(device)
    with memory_cap(dev) as room:
        return _lint(path_or_name, shape_set, dev, limits or LintLimits(), room)


def _lint(
    path_or_name: str | Path,
    shape_set: str | None,
    dev: torch.device,
    limits: LintLimits,
    room: int | None,
) -> LintReport:
    """:func:`lint_problem` under its memory cap (``room``: the bytes it may add, None: no cap)."""
    started = time.perf_counter()
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
        oracle = float64_oracle(model, inputs, dev)
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
        if out_of_memory(exc) and "fits" not in done:
            cap = f"the {_fmt_bytes(room)} it may take" if room else "what this host has"
            message = f"the checks need more memory than {cap}; other checks skipped"
            checks.append(LintCheck("fits", False, message))
            return report()
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
