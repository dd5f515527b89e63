"""Progress of a suite run: a rich progress bar with an ETA on a terminal, plain lines otherwise.

A pair's line carries the reason of a verdict that is not correct (and why a pair was not
judged): whole into a file or a pipe, cut to :data:`REASON_WIDTH` characters with "…" on a
terminal.

The ETA is the mean wall time of the pairs judged so far in this process times the pairs left
(the first pair of each problem pays for starting its workers, so early estimates run high).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from kerneljudge.cli.output import clip
from kerneljudge.suite.layout import Pair
from kerneljudge.verdict import Verdict
from kerneljudge.verdict.render import STATUS_STYLE

__all__ = ["REASON_WIDTH", "SuiteProgress", "format_eta"]

#: Characters of a reason that a pair's line shows on a terminal.
REASON_WIDTH = 100


def format_eta(seconds: float | None) -> str:
    """``1h02m``, ``3m05s`` or ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _speedup(verdict: Verdict) -> str:
    s = verdict.timing.speedup("eager") if verdict.timing else None
    if s is None:
        return ""
    return f" {s.median:.2f}x (95% CI {s.ci95[0]:.2f}-{s.ci95[1]:.2f})"


class SuiteProgress:
    """A reporter for :func:`kerneljudge.suite.runner.run_pairs`; use as a context manager.

    Args:
        console: where to write; a bar when it is a terminal, else one line per pair.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar = console.is_terminal
        self.total = 0
        self.count = 0
        self.t0 = time.monotonic()
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> SuiteProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def eta_s(self) -> float | None:
        """Seconds left at the mean pace of this process so far; None before the first pair."""
        if not self.count:
            return None
        return (time.monotonic() - self.t0) / self.count * (self.total - self.count)

    def __call__(self, event: str, pair: Pair | None, data: Any) -> None:
        if event == "start":
            self.total, already = data
            self.t0 = time.monotonic()
            if already:
                self.console.print(f"{already} pairs already judged; {self.total} to go")
            if self.bar and self.total:
                self._progress = Progress(
                    TextColumn("[bold]{task.description}", justify="left"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("eta"),
                    TimeRemainingColumn(),
                    console=self.console,
                    transient=False,
                )
                self._progress.start()
                self._task = self._progress.add_task("judging", total=self.total)
        elif event == "pair" and pair is not None and self._progress is not None:
            label = escape(f"{pair.problem.name}/{pair.sample}")
            self._progress.update(self._task, description=label)
        elif event in ("verdict", "skip") and pair is not None:
            self.count += 1
            width = REASON_WIDTH if self.bar else None
            label = escape(f"{pair.problem.name}/{pair.sample}")
            if event == "verdict":
                verdict, seconds = data
                style = STATUS_STYLE.get(verdict.status, "")
                what = f"[{style}]{verdict.status.value}[/]{_speedup(verdict)}"
                if verdict.reason and not verdict.correct:
                    what += f" [dim]{escape(clip(verdict.reason, width))}[/]"
            else:
                what, seconds = f"[yellow]not judged[/] {escape(clip(str(data), width))}", None
            took = f" {seconds:.1f}s" if seconds is not None else ""
            if self._progress is not None:
                self._progress.console.print(f"{label}: {what}{took}", highlight=False)
                self._progress.advance(self._task)
            else:
                self.console.print(
                    f"[{self.count}/{self.total}] {label}: {what}{took}, "
                    f"eta {format_eta(self.eta_s())}",
                    highlight=False,
                )
