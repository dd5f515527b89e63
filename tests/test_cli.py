"""The command line: verdicts as tables and JSON, one-line errors with non-zero exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.verdict import Verdict

FIX = Path(__file__).parent / "fixtures"
runner = CliRunner()
#: A stage line on stderr where it is not a terminal: seconds since the start, the stage.
STAGE = re.compile(r"^ *\d+\.\d s  (?=\S)")


def _eval(*args: str, cache: Path) -> object:
    return runner.invoke(
        app,
        [
            "eval",
            *args,
            "--device",
            "cpu",
            "--cache-dir",
            str(cache),
            "--baselines",
            "eager",
            "--max-time",
            "0.3",
        ],
    )


def test_eval_json_is_a_verdict(tmp_path: Path) -> None:
    res = _eval(
        str(FIX / "candidates" / "good.py"),
        "-p",
        str(FIX / "tiny_problem.py"),
        "--json",
        cache=tmp_path,
    )
    assert res.exit_code == 0, res.output
    v = Verdict.from_json(res.stdout)
    assert v.correct and v.timing is not None and v.schema_version
    # The stages, one plain line each on stderr (not a terminal here), in order.
    stages = [STAGE.sub("", ln) for ln in res.stderr.splitlines()]
    assert all(STAGE.match(ln) for ln in res.stderr.splitlines()), res.stderr
    assert stages[0] == "building good.py (torch)" and stages[-1] == "timing", stages
    assert stages.index("preparing the reference") < stages.index("trial 1/5")
    assert stages.index("trial 1/5") < stages.index("trial 5/5") < stages.index("timing")


def test_eval_table_and_exit_code_for_incorrect(tmp_path: Path) -> None:
    res = _eval(
        str(FIX / "candidates" / "wrong.py"),
        "-p",
        str(FIX / "tiny_problem.py"),
        "--no-timing",
        cache=tmp_path,
    )
    assert res.exit_code == 1
    assert "INCORRECT" in res.output and "first mismatches" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["/no/such/file.py", "-p", "causal_gqa"], "candidate file not found"),
        (["{good}", "-p", "no_such_problem"], "no problem named 'no_such_problem'"),
        (["{good}", "-p", "{good}", "--tolerance", "loose"], "--tolerance must be"),
        (["{tmp}", "-p", "causal_gqa"], "candidate file {tmp} is a folder, not a file"),
        (["/dev/null", "-p", "causal_gqa"], "candidate file /dev/null is not a regular file"),
        (["{good}", "-p", "{tmp}"], "problem file {tmp} is a folder, not a file"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    good = str(FIX / "candidates" / "good.py")
    res = _eval(*[a.format(good=good, tmp=tmp_path) for a in args], cache=tmp_path)
    message = message.format(tmp=tmp_path)
    assert res.exit_code == 2
    assert message in res.output
    assert "Traceback" not in res.output


def test_candidate_without_modelnew_and_syntax_error(tmp_path: Path) -> None:
    nomodel = tmp_path / "nomodel.py"
    nomodel.write_text("import torch\n")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("class ModelNew(\n")
    for path, message in ((nomodel, "does not define ModelNew"), (syntax, "syntax error")):
        res = _eval(str(path), "-p", str(FIX / "tiny_problem.py"), cache=tmp_path)
        assert res.exit_code == 1 and res.stdout == ""
        lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not STAGE.match(ln)]
        assert len(lines) == 1 and message in lines[0] and lines[0].startswith("compile_error")


def test_problems_list_and_show() -> None:
    res = runner.invoke(app, ["problems"])
    assert res.exit_code == 0 and "causal_gqa" in res.output
    res = runner.invoke(app, ["problems", "show", "causal_gqa"])
    assert res.exit_code == 0 and "class Model" in res.output
    res = runner.invoke(app, ["problems", "show", "nope"])
    assert res.exit_code == 2 and "no problem named" in res.output


def test_build_command_json(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["build", str(FIX / "candidates" / "good.py"), "--cache-dir", str(tmp_path), "--json"]
    )
    assert res.exit_code == 0
    assert json.loads(res.stdout)["ok"] is True


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kerneljudge",
            "eval",
            str(tmp_path / "missing.py"),
            "-p",
            "causal_gqa",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: candidate file not found: {tmp_path / 'missing.py'}"
    assert proc.stdout == ""


def test_help_and_usage_errors_into_a_pipe_are_plain_text() -> None:
    """Piped, help and a usage error are click's plain text (no rich panel)."""
    for args, code, stream in (
        (["report", "--help"], 0, "stdout"),
        (["eval", "-p", "causal_gqa"], 2, "stderr"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kerneljudge", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = getattr(proc, stream)
        assert proc.returncode == code, out
        assert out.startswith("Usage: ") and not set("╭╮╰╯│─") & set(out)
    assert "Missing argument" in proc.stderr


def test_problem_list_cuts_a_description_at_a_sentence_end_only() -> None:
    res = runner.invoke(app, ["problems"])
    assert res.exit_code == 0 and "(Jumper et al. 2021" in res.output


def test_problems_show_into_a_file_is_the_exact_source(tmp_path: Path) -> None:
    """Redirected, `problems show` writes the problem's source as it is (it compiles); the
    metadata goes to stderr."""
    from kerneljudge.problem import Problem, bundled_problem_names

    out = tmp_path / "causal_gqa.py"
    with open(out, "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "kerneljudge", "problems", "show", "causal_gqa"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    source = Problem.load("causal_gqa").source
    assert out.read_text() == source
    compile(out.read_text(), str(out), "exec")
    assert "causal_gqa" in proc.stderr and "dtype" in proc.stderr
    for name in bundled_problem_names():
        res = runner.invoke(app, ["problems", "show", name])
        assert res.exit_code == 0 and res.stdout == Problem.load(name).source, name


def test_verdict_into_a_file_is_plain_whole_lines(tmp_path: Path) -> None:
    """Not a terminal: the verdict is plain lines, the reason whole on one line."""
    import re

    res = _eval(
        str(FIX / "candidates" / "wrong.py"),
        "-p",
        str(FIX / "tiny_problem.py"),
        "--no-timing",
        cache=tmp_path,
    )
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0] == "INCORRECT"
    reason = r"\d/5 trials passed; trial \d: output: max error vs float64 \S+ exceeds \S+ \(16 x"
    assert any(re.match(reason + r".*floor\)$", ln) for ln in lines), res.stdout
    header = next(ln for ln in lines if ln.split()[:3] == ["trial", "shapes", "result"])
    assert header.split()[-1] == "bound"
    assert "…" not in res.stdout and "│" not in res.stdout and "\x1b" not in res.stdout


def test_version_names_the_package_and_torch() -> None:
    import importlib.metadata

    import torch

    proc = subprocess.run(
        [sys.executable, "-m", "kerneljudge", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stderr == ""
    (line,) = proc.stdout.splitlines()
    version = importlib.metadata.version("kerneljudge")
    assert line.startswith(f"kerneljudge {version} (torch {torch.__version__}, CUDA ")


@pytest.mark.parametrize(
    ("signame", "status", "nohup"),
    [("SIGTERM", 143, False), ("SIGHUP", 129, False), ("SIGTERM", 143, True)],
    ids=["sigterm", "sighup", "nohup"],
)
def test_sigterm_stops_eval_as_ctrl_c_does_and_leaves_no_folder(
    signame: str, status: int, nohup: bool, tmp_path: Path
) -> None:
    """``kill PID`` (``timeout``, a batch system) or a closed terminal mid-verdict: the workers
    end, their scratch folders and the probe's are removed, and the exit status is 128 + the
    signal. Started under ``nohup`` (SIGHUP ignored), a SIGHUP is ignored throughout."""
    import os
    import signal
    import time

    def ignore_sighup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kerneljudge",
            "eval",
            str(FIX / "candidates" / "hang.py"),
            "-p",
            str(FIX / "tiny_problem.py"),
            "--device",
            "cpu",
            "--local",
            "--baselines",
            "eager",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        preexec_fn=ignore_sighup if nohup else None,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # a line per stage: stop it while it runs the candidate
            if "trial 1/" in line or time.monotonic() > deadline:
                break
        assert any(tmp.glob("kj-candidate-*")), "the candidate runs in a scratch folder"
        if nohup:
            proc.send_signal(signal.SIGHUP)
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=2)  # still judging
        proc.send_signal(signal.Signals[signame])
        assert proc.wait(timeout=60) == status
    finally:
        proc.kill()
        proc.wait()
    assert [p.name for p in tmp.glob("kj-*")] == []
