"""The suite's commands into a file or a pipe print whole plain lines, as every command does:
tables as aligned rows (no box drawing), reasons whole; on a terminal a cut reason ends in
"…"."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.cli.output import clip, make_console
from kerneljudge.suite.layout import Pair, SuiteProblem
from kerneljudge.suite.progress import REASON_WIDTH, SuiteProgress
from kerneljudge.suite.store import ResultsStore
from kerneljudge.verdict import Status, Verdict

#: A reason longer than any cut, with a line break inside and its end marked.
REASON = "output 3 differs: " + "max abs error 0.5 at index 17, " * 8 + "\nthe end"
BOX = set("┃│━─┏┓┗┛┡┩╇╈┳┻")


def _verdict(status: Status, reason: str = "") -> Verdict:
    return Verdict(
        status=status,
        reason=reason,
        problem="relu",
        candidate_sha256="0" * 64,
        backend="torch",
        versions={"torch": "2.x"},
    )


def _store(path: Path) -> Path:
    with ResultsStore(path) as store:
        store.create_run("r1", spec={"suite": ["s"], "candidates": "c"}, model="m")
        store.set_problems("r1", [{"problem": "relu", "level": 1, "tags": ["t"], "planned": 2}])
        store.add_verdict("r1", problem="relu", sample="a", source="x", verdict=_verdict(
            Status.INCORRECT, REASON))  # fmt: skip
        store.add_verdict("r1", problem="relu", sample="b", source="y", verdict=_verdict(
            Status.CORRECT))  # fmt: skip
    return path


def test_clip_keeps_one_line_and_marks_a_cut() -> None:
    assert clip("a\n  b\n\nc") == "a b c"
    assert clip("abcdef", 10) == "abcdef"
    assert clip("abcdefghijkl", 6) == "abcde…" and len(clip("abcdefghijkl", 6)) == 6


def test_results_tables_into_a_pipe_are_plain_rows_with_whole_reasons(tmp_path: Path) -> None:
    db = _store(tmp_path / "r.db")
    runner = CliRunner()
    outputs = {}
    for cmd in (["runs"], ["show", "r1"], ["metrics", "r1", "--by", "level"]):
        res = runner.invoke(app, ["results", *cmd, "--store", str(db)])
        assert res.exit_code == 0, res.output
        assert not BOX & set(res.output), res.output
        assert "…" not in res.output and "\x1b" not in res.output
        outputs[cmd[0]] = res.output.splitlines()
    runs = outputs["runs"]
    assert runs[1].split() == ["run", "created", "state", "model", "problems", "judged", "correct"]
    assert runs[2].split()[0] == "r1" and runs[2].split()[-2:] == ["2/2", "1"]
    (row,) = [line for line in outputs["show"] if line.startswith("relu") and " a " in line]
    assert row.endswith(clip(REASON)) and "the end" in row  # whole, on one line
    metrics = outputs["metrics"]
    assert metrics[1].split()[:4] == ["group", "problems", "samples", "correct"]
    assert metrics[2].split()[:5] == ["level", "1", "1", "2", "50.0"]


def test_results_show_on_a_terminal_cuts_a_reason_visibly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kerneljudge.suite import results_cli

    db = _store(tmp_path / "r.db")
    out = io.StringIO()
    monkeypatch.setattr(results_cli, "console", Console(file=out, force_terminal=True, width=300))
    res = CliRunner().invoke(app, ["results", "show", "r1", "--store", str(db)])
    assert res.exit_code == 0, res.output
    text = out.getvalue()
    assert clip(REASON, results_cli.REASON_WIDTH) in text and "the end" not in text


def _pair() -> Pair:
    problem = SuiteProblem("relu", Path("relu.py"))
    return Pair(problem, "a", Path("a.py"))


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_lines_hold_the_whole_reason_unless_on_a_terminal(terminal: bool) -> None:
    out = io.StringIO()
    console = (
        Console(file=out, force_terminal=True, width=300) if terminal else make_console(file=out)
    )
    with SuiteProgress(console) as progress:
        progress("start", None, (2, 0))
        progress("pair", _pair(), None)
        progress("verdict", _pair(), (_verdict(Status.INCORRECT, REASON), 1.0))
        progress("skip", _pair(), "needs a CUDA GPU: " + REASON)
    text = out.getvalue()
    if terminal:
        assert clip(REASON, REASON_WIDTH) in text and "the end" not in text
    else:
        lines = text.splitlines()
        assert lines[0].startswith("[1/2] relu/a: incorrect ") and clip(REASON) in lines[0]
        assert lines[1].startswith("[2/2] relu/a: not judged needs a CUDA GPU: " + clip(REASON))
        assert len(lines) == 2
