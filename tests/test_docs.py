"""docs/first-candidate.md: its files are the ones it shows, and its commands give its verdicts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneljudge.cli.app import app

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "first-candidate.md"
FILES = REPO / "docs" / "first-candidate"
STATUSES = {"CORRECT", "INCORRECT", "COMPILE_ERROR", "RUNTIME_ERROR", "TIMEOUT", "REJECTED"}
#: Output lines of the walkthrough that hold no measurement and so must appear as shown.
EXACT = re.compile(
    r"^(RuntimeError: .*|cumsum_\w+\.py:\d+: error: .*|  [ >] +\d+ \| .*|  line \d+: .*)$"
)


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_walkthrough_shows_its_files_as_they_are() -> None:
    shown = [b for b in _blocks("python") if "load_inline" in b]
    assert shown == [(FILES / "my_cumsum.py").read_text()]
    linked = re.findall(r"\(first-candidate/(\w+\.py)\)", DOC.read_text())
    assert set(linked) == {p.name for p in FILES.glob("*.py")}
    commands = [ln for b in _blocks("console") for ln in b.splitlines() if ln.startswith("$ ")]
    named = {Path(w).name for c in commands for w in shlex.split(c) if w.endswith(".py")}
    assert named <= {p.name for p in FILES.glob("*.py")} | {"cumsum_problem.py"}
    assert "first-candidate.md" in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_the_walkthrough_commands_give_its_verdicts(shared_cache: Path) -> None:
    """Each `kerneljudge build` and `eval --shape-sets tiny` block: the status, and every
    output line that holds no measurement, as shown."""
    runner = CliRunner()
    checked = 0
    for block in _blocks("console"):
        lines = block.splitlines()
        last = max(i for i, ln in enumerate(lines) if ln.startswith("$ "))
        lines = lines[last:]  # the block's last command and its output
        words = shlex.split(lines[0][2:]) if lines[0].startswith("$ kerneljudge ") else []
        if words[1:2] not in (["build"], ["eval"]) or "--json" in words:
            continue
        if words[1] == "eval" and "tiny" not in words:
            continue  # the public shapes take minutes on a CPU
        args = [str(FILES / Path(w).name) if w.endswith(".py") else w for w in words[1:]]
        res = runner.invoke(app, [*args, "--cache-dir", str(shared_cache)])
        shown = lines[1:]
        if words[1] == "build":
            assert res.exit_code == 0 and res.stdout.startswith(shown[0].split(" in ")[0])
            checked += 1
            continue
        status = next(ln for ln in shown if ln in STATUSES)
        assert res.exit_code == (0 if status == "CORRECT" else 1), res.output
        got = res.stdout.splitlines()
        assert status in got and "problem cumsum  backend cpp" in got
        for line in shown:
            if EXACT.match(line) or (line and not re.search(r"\d|^device |^\.\.\.$", line)):
                assert line in got, (words, line, res.stdout)
        checked += 1
    assert checked == 5
