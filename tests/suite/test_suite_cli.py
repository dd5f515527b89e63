"""``kerneljudge suite run``'s checks and its dry run, judging nothing: a dry run refuses what
the run itself refuses and prints a resumed run's plan; a resume refuses options that would
change the run; bad input is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.suite.runner import SuiteOptions, start_run
from kerneljudge.suite.store import ResultsStore
from kerneljudge.verdict import Status, Verdict

from .small_suite import write_candidate, write_suite


def _suite_run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["suite", "run", *args])
    assert "Traceback" not in res.output, res.output
    return res.exit_code, res.output


def _one_error(code: int, output: str, text: str) -> None:
    assert code == 2, output
    assert len(output.strip().splitlines()) == 1 and output.startswith("error: "), output
    assert text in output, output


def _run(tmp_path: Path, samples: tuple[str, ...] = ("a", "b")) -> tuple[Path, Path, Path]:
    suite = write_suite(tmp_path)
    cands = tmp_path / "cands"
    for sample in samples:
        write_candidate(cands, sample)
    db = tmp_path / "r.db"
    with ResultsStore(db) as store:
        start_run(
            store,
            suite=[str(suite)],
            candidates=cands,
            options=SuiteOptions(device="cpu"),
            run_id="t",
        )
        verdict = Verdict(Status.CORRECT, "", "relu", "0" * 64, "torch")
        store.add_verdict("t", problem="relu", sample="a", source="s", verdict=verdict)
    return suite, cands, db


def test_a_dry_run_of_a_resume_prints_the_runs_plan(tmp_path: Path) -> None:
    _, cands, db = _run(tmp_path)
    code, out = _suite_run("--resume", "t", "--dry-run", "--store", str(db))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"run t (running), store {db}"
    assert lines[1:] == [
        "relu: level None, 2 candidates, 1 judged",
        "1 problems, 2 pairs: 1 judged, 1 to judge",
    ]
    # One file added, one planned and not judged removed: the plan keeps it and says why.
    write_candidate(cands, "c")
    (cands / "relu" / "b.py").unlink()
    code, out = _suite_run("--resume", "t", "--dry-run", "--store", str(db))
    assert code == 0, out
    assert out.splitlines()[1:] == [
        "relu: level None, 3 candidates, 1 judged",
        "1 problems, 3 pairs: 1 judged, 1 to judge, 1 that cannot be judged (below)",
        f"not judged: relu/b: its candidate file {cands.resolve() / 'relu' / 'b.py'} is no "
        "longer in the candidates folder",
    ]
    with ResultsStore(db) as store:  # a dry run writes nothing
        assert store.run("t").planned == 2 and len(store.planned("t")) == 2


def test_a_dry_run_of_an_unknown_run_or_store_is_one_line(tmp_path: Path) -> None:
    _, _, db = _run(tmp_path)
    for args in (["--resume", "nope"], ["--resume", "nope", "--dry-run"]):
        code, out = _suite_run(*args, "--store", str(db))
        _one_error(code, out, f"no run 'nope' in {db}")
    code, out = _suite_run("--resume", "t", "--dry-run", "--store", str(tmp_path / "typo.db"))
    _one_error(code, out, f"no results store at {tmp_path / 'typo.db'}")
    assert not (tmp_path / "typo.db").exists()


def test_a_dry_run_refuses_what_the_run_refuses(tmp_path: Path) -> None:
    suite, cands, db = _run(tmp_path)
    new = [str(suite), "-c", str(cands), "--store", str(db)]
    for extra, text in (
        (["--run-id", "t"], f"a run named 't' is already in {db}"),
        (["--sampling", "temperature"], "--sampling expects key=value, not 'temperature'"),
        (["--meta", "[1]"], "--meta must be a JSON object"),
        (["--trials", "1", "--tolerance", "exact"], "--tolerance"),
    ):
        for dry in ([], ["--dry-run"]):
            code, out = _suite_run(*new, *extra, *dry)
            _one_error(code, out, text)
    code, out = _suite_run(*new, "--run-id", "fresh", "--dry-run")
    assert code == 0 and out.splitlines() == [
        "relu: level None, 2 candidates",
        "1 problems, 2 pairs",
    ]
    fresh = tmp_path / "fresh.db"
    code, out = _suite_run(
        str(suite), "-c", str(cands), "--run-id", "x", "--store", str(fresh), "--dry-run"
    )
    assert code == 0 and not fresh.exists(), out


def test_a_resume_refuses_options_that_would_change_the_run(tmp_path: Path) -> None:
    _, _, db = _run(tmp_path)
    for extra, named in (
        (["--model", "other", "--run-id", "zz"], "--run-id, --model"),
        (["--sampling", "temperature=1"], "--sampling"),
        (["--meta", '{"a": 1}'], "--meta"),
        (["--layout", "ours"], "--layout"),
    ):
        for dry in ([], ["--dry-run"]):
            code, out = _suite_run("--resume", "t", *extra, *dry, "--store", str(db))
            _one_error(code, out, f"--resume keeps the run's own {named}; give none of them")
    code, out = _suite_run("--resume", "t", "--trials", "3", "--store", str(db))
    _one_error(code, out, "--resume judges with the options stored with the run")


def test_a_candidates_file_is_refused_as_not_a_folder(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    path = write_candidate(tmp_path / "cands", "a")
    for dry in ([], ["--dry-run"]):
        code, out = _suite_run(str(suite), "-c", str(path), "--store", str(tmp_path / "r.db"), *dry)
        _one_error(code, out, f"must be a folder (of candidate files), not the file {path}")
