"""The lint's ``output_shape`` check: a reference's output shape must follow from its inputs.

A reference that slices one element too few or too many (an exclusive cumsum written
``x.cumsum(1)[:, :-1]`` without its leading zero) still runs, and every candidate written to
the problem's description then fails against it. Two rules, at every shape set of the problem:

* declared: a problem may define ``output_shape(*inputs)``, called with the shape
  (``torch.Size``) of each tensor forward input and the value of every other one, returning the
  expected output shape (a tuple of ints), or a list of shapes for a tuple of outputs. Every
  shape set's reference output must have exactly that shape;
* inferred, with two or more shape sets and no ``output_shape``: every output dimension must be
  explained across all sets at once, by one rule that holds in every set: a constant, a
  dimension of an input, an integer shape global, or the product, sum or exact quotient of two
  of those (not of constants: ``L + 1`` is what an off-by-one looks like). The number of
  outputs and their ranks must not change between sets either.

The reference is traced with fake tensors (``FakeTensorMode``: shapes only, no memory, no
compute), so every shape set is checked at no cost; a set whose reference cannot be traced so
(it reads tensor values, e.g. ``.item()``) is left out, and with the linted set's real output
standing in for it when it is the linted one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.check import flatten_outputs
from kerneljudge.problem import Problem

__all__ = ["OutputShapes", "check_output_shapes", "traced_output_shapes"]

#: Per shape set: the shapes of the outputs and the "explaining" values (input dimensions and
#: integer shape globals) of that set.
OutputShapes = dict[str, tuple[list[tuple[int, ...]], dict[str, int], list[Any]]]


def _shapes(outputs: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in flatten_outputs(outputs) if isinstance(t, torch.Tensor)]


def traced_output_shapes(problem: Problem, real: dict[str, Any] | None = None) -> OutputShapes:
    """Trace the reference at every shape set (the problem is left at the set it was at).

    Args:
        problem: a loaded problem.
        real: outputs already computed, by shape set name, used when a set cannot be traced.

    Returns:
        ``{set: (output shapes, named values, forward inputs as shapes/values)}`` for every
        set that could be traced; named values are ``"input i dim j"`` and ``"<global>"``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = problem.shape_set
    names = list(problem.shape_sets) or ["public"]
    out: OutputShapes = {}
    try:
        for name in names:
            problem.use_shape_set(name)
            try:
                with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
                    model = problem.make_model(0)
                    inputs = problem.make_inputs(0)
                    shapes = _shapes(model(*inputs))
            except Exception:  # noqa: BLE001 - data-dependent references cannot be traced
                if real is None or name not in real:
                    continue
                inputs = problem.make_inputs(0)
                shapes = _shapes(real[name])
            values: dict[str, int] = {}
            described: list[Any] = []
            for i, x in enumerate(inputs):
                if isinstance(x, torch.Tensor):
                    described.append(torch.Size(x.shape))
                    for j, size in enumerate(x.shape):
                        values[f"input {i} dim {j}"] = int(size)
                else:
                    described.append(x)
            for key, value in problem.shape_globals().items():
                if isinstance(value, int) and not isinstance(value, bool):
                    values[key] = value
            out[name] = (shapes, values, described)
    finally:
        if problem.shape_sets:
            problem.use_shape_set(start)
    return out


Rule = Callable[[dict[str, int]], int]


def _value(k: str) -> Rule:
    return lambda v: v[k]


def _product(a: str, b: str) -> Rule:
    return lambda v: v[a] * v[b]


def _sum(a: str, b: str) -> Rule:
    return lambda v: v[a] + v[b]


def _quotient(a: str, b: str) -> Rule:
    return lambda v: v[a] // v[b] if v[b] and v[a] % v[b] == 0 else -1


def _rules(per_set: list[dict[str, int]]) -> list[tuple[str, Rule]]:
    """Candidate explanations of a dimension: named values common to every set, and the
    products, sums and exact quotients of two of them."""
    common = sorted(set.intersection(*(set(v) for v in per_set)))
    rules: list[tuple[str, Rule]] = [(k, _value(k)) for k in common]
    for a, b in itertools.combinations_with_replacement(common, 2):
        rules.append((f"{a} * {b}", _product(a, b)))
        rules.append((f"{a} + {b}", _sum(a, b)))
    for a, b in itertools.permutations(common, 2):
        rules.append((f"{a} / {b}", _quotient(a, b)))
    return rules


def check_output_shapes(problem: Problem, traced: OutputShapes) -> tuple[bool | None, str]:
    """The ``output_shape`` verdict: ``(passed, detail)``; ``passed`` None when it does not
    apply (no ``output_shape`` and fewer than two traced shape sets)."""
    declared = getattr(problem.module, "output_shape", None)
    if callable(declared):
        for name, (shapes, _, described) in traced.items():
            try:
                want = declared(*described)
            except Exception as exc:  # noqa: BLE001 - problem code
                return False, f"output_shape() raised {type(exc).__name__}: {exc} at {name!r}"
            wanted = [tuple(want)] if want and isinstance(list(want)[0], int) else list(want)
            wanted = [tuple(int(d) for d in s) for s in wanted]
            if wanted != shapes:
                return False, (
                    f"at shape set {name!r} the reference returns {_fmt(shapes)}, "
                    f"output_shape() says {_fmt(wanted)}"
                )
        return True, f"matches output_shape() at {len(traced)} shape set(s)"
    if len(traced) < 2:
        return None, "n/a: fewer than two shape sets and no output_shape()"
    sets = list(traced)
    layouts = {name: [len(s) for s in traced[name][0]] for name in sets}
    if len({tuple(v) for v in layouts.values()}) > 1:
        return False, "the number or rank of outputs changes between shape sets: " + ", ".join(
            f"{n} {_fmt(traced[n][0])}" for n in sets
        )
    per_set = [traced[n][1] for n in sets]
    rules = _rules(per_set)
    shapes0 = traced[sets[0]][0]
    for k, shape in enumerate(shapes0):
        for d in range(len(shape)):
            seen = [traced[n][0][k][d] for n in sets]
            if len(set(seen)) == 1:
                continue  # a constant
            if any(all(rule(v) == s for v, s in zip(per_set, seen)) for _, rule in rules):
                continue
            where = f"output {k} dim {d}" if len(shapes0) > 1 else f"output dim {d}"
            return False, (
                f"{where} is {', '.join(map(str, seen))} at shape sets {', '.join(sets)}: it "
                "follows no input dimension or shape global (an off-by-one slice?); declare "
                "output_shape() if it is meant"
            )
    return True, f"follows the inputs at {len(sets)} shape sets"


def _fmt(shapes: list[tuple[int, ...]]) -> str:
    return ", ".join(str(tuple(s)) for s in shapes) if shapes else "no tensor"
