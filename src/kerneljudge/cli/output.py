"""Where the command line prints: rich on a terminal, whole plain lines anywhere else.

On a terminal, rich fits text and tables to the window. Written to a file or a pipe (a log, a
redirect), rich would fit them to 80 columns and crop what does not fit, so there every line
is printed whole: no wrapping, no cropping, no colour, and a table is one plain line per row
with its columns aligned.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import IO, Any

from rich.console import Console, RenderableType
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

__all__ = ["StageReporter", "clip", "make_console", "plain_table", "print_table"]

#: The width of a console that is not a terminal: text is never wrapped there (``soft_wrap``);
#: a rich renderable that still measures against the width gets this many columns.
PLAIN_WIDTH = 4096


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on ``file`` (default: stdout, or stderr): rich's own on a terminal; elsewhere
    one whose lines are never wrapped or cropped (``soft_wrap``, :data:`PLAIN_WIDTH` columns,
    no colour).

    Whether the stream is a terminal is read when this is called (rich's test: ``isatty``,
    ``FORCE_COLOR``, ``TTY_COMPATIBLE``).
    """
    console = Console(stderr=stderr, file=file)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, file=file, width=PLAIN_WIDTH, soft_wrap=True, no_color=True)


def clip(text: str, limit: int | None = None) -> str:
    """``text`` on one line (each run of whitespace holding a line break becomes one space);
    with ``limit``, cut to at most ``limit`` characters, the last an ellipsis ("…") where
    anything was cut. Terminals get a limit; files and pipes get the whole text (None)."""
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    if limit is None or len(line) <= limit:
        return line
    return line[: max(limit - 1, 0)].rstrip() + "…"


def _plain(cell: RenderableType | None) -> str:
    if cell is None:
        return ""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except MarkupError:  # not valid markup: the text as it is
            return cell
    return str(cell)


def plain_table(table: Table) -> list[str]:
    """A rich table as plain lines: its title, the header, then one line per row, each cell
    whole (one line: line breaks in a cell become spaces), columns aligned by padding."""
    columns = table.columns
    header = [_plain(c.header) for c in columns]
    cells = [[" ".join(_plain(cell).split("\n")) for cell in c.cells] for c in columns]
    rows = [list(r) for r in zip(*cells)] if cells else []
    widths = [max(len(x) for x in [h, *col]) for h, col in zip(header, cells)]

    def line(values: list[str]) -> str:
        padded = [
            v.rjust(w) if c.justify == "right" else v.ljust(w)
            for v, w, c in zip(values, widths, columns)
        ]
        return "  ".join(padded).rstrip()

    title = [_plain(table.title)] if table.title else []
    return [*title, line(header), *(line(r) for r in rows)]


def print_table(console: Console, table: Table) -> None:
    """Print ``table``: rich's table on a terminal, :func:`plain_table`'s lines elsewhere."""
    if console.is_terminal:
        console.print(table)
        return
    for text in plain_table(table):
        console.print(text, markup=False, highlight=False, soft_wrap=True)


class StageReporter:
    """Says which stage a long command is in, on ``console`` (meant for stderr).

    Called with a stage's line (e.g. ``"trial 2/5"``). On a terminal, one status line is
    updated in place while the reporter is entered and erased when it is left; elsewhere each
    call prints one plain line, ``"<seconds since entered> s  <line>"``.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._t0 = time.monotonic()
        self._status: Any = None

    def __enter__(self) -> StageReporter:
        self._t0 = time.monotonic()
        if self.console.is_terminal:
            self._status = self.console.status("starting", spinner="dots")
            self._status.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, line: str) -> None:
        elapsed = time.monotonic() - self._t0
        if self._status is not None:
            self._status.update(f"{line}  [dim](at {elapsed:.0f} s)[/]")
        else:
            self.console.print(
                f"{elapsed:6.1f} s  {line}", markup=False, highlight=False, soft_wrap=True
            )
