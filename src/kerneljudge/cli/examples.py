"""The bundled example candidates: known-correct and known-wrong submissions per problem.

Each file in ``examples/<problem>/`` starts with ``# expected: <status>`` and ``# backend: <b>``;
:func:`run_examples` judges them all and says whether each got its expected status. They are the
main job's default input and the judge's own regression fixtures.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kerneljudge.candidate.backends import GPU_BACKENDS
from kerneljudge.cli.output import print_table
from kerneljudge.errors import KernelJudgeError
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig
from kerneljudge.verdict import Status, Verdict
from kerneljudge.verdict.render import STATUS_STYLE

__all__ = ["Example", "ExampleResult", "examples_dir", "find_examples", "run_examples"]

_HEADER = re.compile(r"^#\s*(expected|backend|compile-error-line):\s*(\S+)", re.MULTILINE)


def examples_dir() -> Path:
    """``$KERNELJUDGE_EXAMPLES_DIR``, else the ``examples/`` folder of the source tree."""
    env = os.environ.get("KERNELJUDGE_EXAMPLES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "examples"


@dataclass(frozen=True)
class Example:
    """One example file and what its header promises."""

    problem: str
    path: Path
    expected: Status
    backend: str
    compile_error_line: int | None = None


@dataclass(frozen=True)
class ExampleResult:
    example: Example
    verdict: Verdict

    @property
    def as_expected(self) -> bool:
        return self.verdict.status is self.example.expected

    def to_dict(self) -> dict[str, object]:
        return {
            "problem": self.example.problem,
            "example": self.example.path.name,
            "expected": self.example.expected.value,
            "as_expected": self.as_expected,
            "verdict": self.verdict.to_dict(),
        }


def find_examples(root: Path | None = None, problem: str | None = None) -> list[Example]:
    """Every example under ``root`` (default :func:`examples_dir`), sorted.

    Raises:
        KernelJudgeError: the folder is missing, or a file lacks its ``# expected:`` header.
    """
    root = root or examples_dir()
    if not root.is_dir():
        raise KernelJudgeError(f"examples folder not found: {root}")
    out = []
    for path in sorted(root.glob("*/*.py")):
        if problem and path.parent.name != problem:
            continue
        fields = dict(_HEADER.findall(path.read_text()[:2000]))
        if "expected" not in fields:
            raise KernelJudgeError(f"{path}: missing '# expected: <status>' header")
        line = fields.get("compile-error-line")
        out.append(
            Example(
                problem=path.parent.name,
                path=path,
                expected=Status(fields["expected"]),
                backend=fields.get("backend", ""),
                compile_error_line=int(line) if line else None,
            )
        )
    if problem and not out:
        raise KernelJudgeError(f"no examples for problem {problem!r} in {root}")
    return out


def run_examples(
    *,
    problem: str | None = None,
    device: str = "auto",
    cache_dir: Path | None = None,
    max_time_s: float = 2.0,
    baselines: tuple[str, ...] = ("eager",),
    console: Console | None = None,
) -> list[ExampleResult]:
    """Judge the examples (GPU backends only when a GPU is visible) and print a table (on a
    terminal, a rich table; elsewhere plain lines, each whole: see :mod:`kerneljudge.cli.output`).

    On a machine without a GPU the ``cpp`` and ``torch`` examples are judged on the CPU. The
    default baseline is eager only: compiling every reference with ``torch.compile`` takes
    minutes on a small CPU.
    """
    gpu = torch.cuda.is_available() and device != "cpu"
    examples = [e for e in find_examples(problem=problem) if gpu or e.backend not in GPU_BACKENDS]
    config = JudgeConfig(
        device=device,
        cache_dir=cache_dir,
        run_timeout_s=20.0,
        baselines=baselines,
        timing_config=TimingConfig(max_time_s=max_time_s),
    )
    results: list[ExampleResult] = []
    table = Table(title="bundled examples")
    for col in ("problem", "example", "backend", "expected", "verdict", "vs eager"):
        table.add_column(col, no_wrap=True)
    table.add_column("note", overflow="fold", max_width=60)
    by_problem: dict[str, list[Example]] = {}
    for e in examples:
        by_problem.setdefault(e.problem, []).append(e)
    for name, group in by_problem.items():
        with Judge(name, config) as judge:
            for e in group:
                if console:
                    console.print(f"judging {name}/{e.path.name} ...", style="dim")
                verdict = judge.evaluate(e.path)
                r = ExampleResult(e, verdict)
                results.append(r)
                s = verdict.timing.speedup("eager") if verdict.timing else None
                table.add_row(
                    name,
                    e.path.name,
                    verdict.backend,
                    e.expected.value,
                    f"[{STATUS_STYLE[verdict.status]}]{verdict.status.value}[/]",
                    f"{s.median:.2f}x" if s else "-",
                    ("" if r.as_expected else "[red]UNEXPECTED[/] ") + escape(verdict.reason),
                )
    if console:
        print_table(console, table)
        if not gpu:
            console.print("no GPU visible: CUDA and Triton examples were skipped", style="dim")
    return results
