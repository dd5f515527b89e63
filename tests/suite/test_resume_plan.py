"""A resumed run whose candidates folder changed: a pair added to the folder joins the plan, a
pair once planned or judged stays in it, so a run never has more verdicts than planned pairs;
a planned pair whose file is gone before it was judged is left undone, saying why."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.suite.runner import SuiteOptions, plan_run, run_pairs, start_run
from kerneljudge.suite.store import ResultsStore

from .small_suite import write_candidate, write_suite


def _counts(store: ResultsStore, run: str) -> tuple[str, int, int]:
    info = store.run(run)
    return info.state, info.judged, info.planned


def test_a_resume_plans_the_earlier_plan_and_the_folder_now(tmp_path: Path) -> None:
    suite = write_suite(tmp_path)
    cands = tmp_path / "cands"
    paths = {s: write_candidate(cands, s) for s in ("a", "b", "c")}
    db = tmp_path / "r.db"
    options = SuiteOptions(device="cpu", trials=1, timing=False)
    with ResultsStore(db) as store:
        run = start_run(store, suite=[str(suite)], candidates=cands, options=options, run_id="t")
        # c leaves the folder after it was planned, before it was judged: left undone.
        paths["c"].unlink()
        summary = run_pairs(store, run)
        assert (summary.judged, summary.planned) == (2, 3)
        assert summary.not_judged == {
            "relu/c": f"its candidate file {paths['c']} is no longer in the candidates folder"
        }
        assert _counts(store, run) == ("incomplete", 2, 3)
        # c comes back and d is added: both judged, the plan grows to 4.
        write_candidate(cands, "c")
        write_candidate(cands, "d")
        summary = run_pairs(store, run)
        assert (summary.judged, summary.already, summary.planned) == (2, 2, 4)
        assert not summary.not_judged
        assert _counts(store, run) == ("finished", 4, 4)
        # Judged files deleted: still planned, still judged, nothing to do.
        for s in ("a", "b", "d"):
            (cands / "relu" / f"{s}.py").unlink()
        summary = run_pairs(store, run)
        assert (summary.judged, summary.already, summary.planned) == (0, 4, 4)
        assert _counts(store, run) == ("finished", 4, 4)
        run_plan = plan_run(store, run, store.run(run).spec)
        assert len(run_plan.planned) == 4 and not run_plan.todo and not run_plan.missing
    res = CliRunner().invoke(app, ["results", "runs", "--store", str(db), "--json"])
    (row,) = json.loads(res.output)
    assert (row["judged"], row["planned"]) == (4, 4)
    res = CliRunner().invoke(app, ["results", "metrics", "t", "--store", str(db), "--json"])
    assert json.loads(res.output)["groups"][0]["samples"] == 4
