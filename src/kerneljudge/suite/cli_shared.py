"""What the suite's commands share: their consoles, options, one-line failures and the store.

The consoles are :func:`kerneljudge.cli.output.make_console`'s: rich on a terminal, whole
plain lines into a file or a pipe, as every other command prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from kerneljudge.cli.output import make_console

__all__ = ["RunArg", "StoreOpt", "console", "csv", "err_console", "fail", "open_store"]

console = make_console()
err_console = make_console(stderr=True)

StoreOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--store",
        envvar="KERNELJUDGE_STORE",
        help="Results store file (default ~/.kerneljudge/results.db).",
    ),
]
RunArg = Annotated[str, typer.Argument(help="Run id, a unique prefix of one, or 'latest'.")]


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr in one line and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def csv(text: str) -> tuple[str, ...]:
    """The items of a comma list, stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def open_store(store: Path | None, *, create: bool = False) -> Any:
    """The :class:`~kerneljudge.suite.store.ResultsStore` at ``store`` (None: the default
    path). A store that does not exist is made only with ``create`` (a new suite run); the
    commands that read refuse it (:class:`~kerneljudge.suite.store.StoreError`, one line
    naming the path)."""
    from kerneljudge.suite.store import ResultsStore

    return ResultsStore(store, create=create)
