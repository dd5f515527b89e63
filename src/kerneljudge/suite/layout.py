"""What a suite run judges: the suite's problems and the candidate files for each.

Suites (any mix, in order):

* ``bundled``: every problem that ships with kerneljudge;
* a folder of problem files (a KernelBench level folder such as ``KernelBench/level1`` with
  files like ``1_Square_matrix_multiplication_.py``), or a folder whose subfolders are level
  folders (``level1``, ``level2``, ...);
* a problem file, or a bundled problem's name.

A problem's name is its ``NAME`` (else the file stem), its tags its ``TAGS``, its level its
``LEVEL`` (else the ``N`` of a ``levelN`` folder it sits in). These are read from the file's
syntax tree, without running it. Its KernelBench number is the stem's leading integer.

Candidate layouts under the candidates folder (``auto`` accepts both):

* ``ours``: ``<problem>/<sample>.py`` (any number of samples, the stem is the sample id) or
  ``<problem>.py`` (one sample, id ``0``);
* ``kernelbench``: ``level_<L>_problem_<N>_sample_<S>_kernel.py`` (the sample id is ``S``),
  matched to the problem of level ``L`` numbered ``N``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kerneljudge.errors import KernelJudgeError
from kerneljudge.problem import bundled_problems_dir, resolve_problem

__all__ = ["LAYOUTS", "Pair", "SuiteProblem", "find_candidates", "load_suite"]

LAYOUTS = ("auto", "ours", "kernelbench")
_KB_FILE = re.compile(r"^level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
_LEVEL_DIR = re.compile(r"^level_?(\d+)$", re.IGNORECASE)


@dataclass(frozen=True)
class SuiteProblem:
    """One problem of a suite: ``name``, file ``path``, ``level`` (or None), ``tags`` and its
    KernelBench ``number`` (or None)."""

    name: str
    path: Path
    level: int | None = None
    tags: tuple[str, ...] = ()
    number: int | None = None

    def to_dict(self, planned: int = 0) -> dict[str, object]:
        return {
            "problem": self.name,
            "path": str(self.path),
            "level": self.level,
            "tags": list(self.tags),
            "planned": planned,
        }


@dataclass(frozen=True)
class Pair:
    """One (problem, candidate) pair to judge: ``sample`` is the candidate's id within it."""

    problem: SuiteProblem
    sample: str
    path: Path

    @property
    def key(self) -> tuple[str, str]:
        return (self.problem.name, self.sample)


_ABSENT = object()


def _literal(tree: ast.Module, name: str, path: Path) -> object:
    """The literal value of the module-level assignment to ``name`` (the last one), or
    :data:`_ABSENT` where there is none.

    Raises:
        KernelJudgeError: the value is not a literal (it cannot be read without running).
    """
    found: object = _ABSENT
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        if value is None or not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue  # another name, or an annotation without a value
        try:
            found = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError):
            raise KernelJudgeError(
                f"problem file {path}: {name} must be a literal (a suite reads it without "
                f"running the file), not {ast.unparse(value)}"
            ) from None
    return found


def _field(path: Path, name: str, value: object, ok: bool, want: str) -> None:
    if not ok:
        raise KernelJudgeError(f"problem file {path}: {name} must be {want}, not {value!r}")


def read_problem(path: Path) -> SuiteProblem:
    """A problem file's name, level, tags and number, read without running it. A ``NAME``,
    ``LEVEL`` or ``TAGS`` it assigns must be a literal non-empty string, an integer (or None),
    a list of strings.

    Raises:
        KernelJudgeError: the file cannot be read or parsed, or one of those fields holds
            something else (the message names the file and the field).
    """
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise KernelJudgeError(f"cannot read problem file {path}: {exc}") from None
    name = _literal(tree, "NAME", path)
    level = _literal(tree, "LEVEL", path)
    tags = _literal(tree, "TAGS", path)
    if name is not _ABSENT:
        _field(path, "NAME", name, isinstance(name, str) and bool(name), "a non-empty string")
    if level is not _ABSENT:
        is_int = isinstance(level, int) and not isinstance(level, bool)
        _field(path, "LEVEL", level, level is None or is_int, "an integer")
    if tags is not _ABSENT:
        ok = isinstance(tags, (list, tuple)) and all(isinstance(t, str) for t in tags)
        _field(path, "TAGS", tags, ok, "a list of strings")
    if not isinstance(level, int):
        found = _LEVEL_DIR.match(path.parent.name)
        level = int(found.group(1)) if found else None
    number = re.match(r"^(\d+)_", path.stem)
    return SuiteProblem(
        name=name if isinstance(name, str) else path.stem,
        path=path.resolve(),
        level=level,
        tags=tuple(tags) if isinstance(tags, (list, tuple)) else (),
        number=int(number.group(1)) if number else None,
    )


def _natural(text: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _problem_files(folder: Path) -> list[Path]:
    files = [p for p in folder.glob("*.py") if not p.name.startswith("_")]
    if files:
        return sorted(files, key=lambda p: _natural(p.name))
    levels = sorted(
        (d for d in folder.iterdir() if d.is_dir() and _LEVEL_DIR.match(d.name)),
        key=lambda d: _natural(d.name),
    )
    return [f for d in levels for f in _problem_files(d)]


def load_suite(specs: Sequence[str]) -> list[SuiteProblem]:
    """The problems of the suites ``specs`` (see the module docstring), in order.

    Raises:
        KernelJudgeError: a spec names nothing, a folder holds no problem file, a file cannot
            be parsed, or two problems share a name.
    """
    if not specs:
        raise KernelJudgeError("no suite given (a folder, problem files, names, or 'bundled')")
    paths: list[Path] = []
    for spec in specs:
        if spec == "bundled":
            paths += _problem_files(bundled_problems_dir())
        elif Path(spec).is_dir():
            found = _problem_files(Path(spec))
            if not found:
                raise KernelJudgeError(f"no problem files in {spec}")
            paths += found
        else:
            paths.append(resolve_problem(spec))
    problems: dict[str, SuiteProblem] = {}
    for path in paths:
        p = read_problem(path)
        if p.name in problems and problems[p.name].path != p.path:
            raise KernelJudgeError(
                f"two problems are named {p.name!r}: {problems[p.name].path} and {p.path}"
            )
        problems[p.name] = p
    return list(problems.values())


def find_candidates(
    root: Path, problems: Sequence[SuiteProblem], layout: str = "auto"
) -> tuple[list[Pair], list[Path]]:
    """The pairs to judge under ``root``, grouped by problem in suite order, samples in natural
    order; and the ``.py`` files found that match no problem.

    Raises:
        KernelJudgeError: ``root`` is missing or a file, ``layout`` is unknown, or two files
            claim the same (problem, sample).
    """
    if layout not in LAYOUTS:
        raise KernelJudgeError(f"unknown layout {layout!r} (use one of {', '.join(LAYOUTS)})")
    if root.exists() and not root.is_dir():
        raise KernelJudgeError(
            f"the candidates path must be a folder (of candidate files), not the file {root}"
        )
    if not root.is_dir():
        raise KernelJudgeError(f"candidates folder not found: {root}")
    by_name = {p.name: p for p in problems}
    by_number: dict[tuple[int | None, int], list[SuiteProblem]] = {}
    for p in problems:
        if p.number is not None:
            by_number.setdefault((p.level, p.number), []).append(p)
    found: dict[tuple[str, str], Pair] = {}
    unmatched: list[Path] = []

    def add(problem: SuiteProblem, sample: str, path: Path) -> None:
        key = (problem.name, sample)
        if key in found:
            raise KernelJudgeError(
                f"{found[key].path} and {path} are both sample {sample!r} of {problem.name}"
            )
        found[key] = Pair(problem, sample, path.resolve())

    for path in sorted(root.glob("*.py")):
        kb = _KB_FILE.match(path.name)
        if kb and layout in ("auto", "kernelbench"):
            level, number, sample = (int(g) for g in kb.groups())
            hits = by_number.get((level, number)) or by_number.get((None, number), [])
            if len(hits) == 1:
                add(hits[0], str(sample), path)
                continue
        elif path.stem in by_name and layout in ("auto", "ours"):
            add(by_name[path.stem], "0", path)
            continue
        unmatched.append(path)
    if layout in ("auto", "ours"):
        for folder in sorted(d for d in root.iterdir() if d.is_dir()):
            if folder.name not in by_name:
                unmatched += sorted(folder.glob("*.py"))
                continue
            for path in sorted(folder.glob("*.py")):
                add(by_name[folder.name], path.stem, path)
    order = {p.name: i for i, p in enumerate(problems)}
    pairs = sorted(found.values(), key=lambda x: (order[x.problem.name], _natural(x.sample)))
    return pairs, unmatched
