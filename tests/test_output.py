"""Output into a file or a pipe: whole plain lines, never cropped to a terminal's width."""

from __future__ import annotations

import io
import re

from rich.console import Console
from rich.table import Table

from kerneljudge.cli.output import make_console, plain_table, print_table

LONG = "the reason " * 30 + "[0, 1] ends here"


def test_tables_into_a_file_are_whole_plain_lines() -> None:
    table = Table(title="bundled examples")
    for col in ("problem", "example", "note"):
        table.add_column(col, no_wrap=True, max_width=10, overflow="ellipsis")
    table.add_column("n", justify="right")
    table.add_row("causal_gqa", "cpp_reference_with_a_long_name.py", LONG.replace("[", r"\["), "7")
    table.add_row("x", "y.py", "[red]UNEXPECTED[/] short", "12")
    out = io.StringIO()
    console = make_console(file=out)
    assert not console.is_terminal
    print_table(console, table)
    lines = out.getvalue().splitlines()
    assert lines[0] == "bundled examples"
    assert lines[1].split() == ["problem", "example", "note", "n"]
    assert "cpp_reference_with_a_long_name.py" in lines[2] and lines[2].endswith("7")
    assert LONG in lines[2] and lines[3].endswith("12")
    assert "UNEXPECTED short" in lines[3] and "[red]" not in lines[3]
    assert lines[2].index("cpp_ref") == lines[3].index("y.py")  # columns aligned
    assert "…" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert plain_table(table) == lines


def test_plain_console_neither_wraps_nor_crops() -> None:
    out = io.StringIO()
    console = make_console(file=out)
    console.print("x" * 500 + " end", highlight=False)
    assert out.getvalue() == "x" * 500 + " end\n"


def test_a_long_compiler_log_shows_its_start() -> None:
    """The shaped log begins with the errors at the candidate's lines; those are shown, the
    rest of a long log is counted."""
    from kerneljudge.verdict import BuildResult, Status, Verdict
    from kerneljudge.verdict.render import render_verdict

    log = "k.py:9: error: 'x' was not declared\n" + "\n".join(f"noise {i}" * 20 for i in range(99))
    build = BuildResult(ok=False, backend="cpp", cache_key="k", log=log)
    reason = "line 9: 'x' was not declared"
    v = Verdict(
        status=Status.COMPILE_ERROR,
        reason=reason,
        problem="p",
        candidate_sha256="0",
        backend="cpp",
        build=build,
    )
    for terminal in (False, True):
        out = io.StringIO()
        console = Console(file=out, force_terminal=terminal, width=200)
        render_verdict(v, console)
        text = out.getvalue()
        assert "k.py:9: error: 'x' was not declared" in text and "noise 98" not in text
        assert re.search(r"\.\.\. \d+ more lines", text), text
