"""The HTML report of real suite runs, read as text: plots, metrics, the comparison, every
candidate's section, escaping of what candidates wrote; and ``kerneljudge report``'s one-line
errors. The page in a real browser: ``test_report_browser.py``."""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kerneljudge.suite.htmlreport import render_report, write_report
from kerneljudge.suite.htmlreport.data import compare_problem
from kerneljudge.suite.metrics import compute_metrics
from kerneljudge.suite.store import ResultsStore

from .report_runs import EPISODE, RUN_A, RUN_B, SCRIPT_IN_SOURCE

REPO = Path(__file__).resolve().parents[2]
PLOTS = ("distribution", "fastp", "speedups", "roofline", "statuses")


def test_the_runs_hold_the_statuses_they_were_built_for(report_store: Path) -> None:
    with ResultsStore(report_store) as store:
        for run, pairs in (("a", RUN_A), ("b", RUN_B)):
            got = {(r.problem, r.sample): r for r in store.verdicts(run)}
            for pair, (_, status) in pairs.items():
                assert got[pair].status == status, (pair, got[pair].verdict.reason)
        assert got[("relu", "same")].speedup is not None
        episode = {(r.problem, r.sample): r for r in store.verdicts("a")}[EPISODE]
        assert episode.transcript and episode.status == "correct"


def test_the_page_holds_every_plot_table_and_candidate(report_store: Path) -> None:
    from PIL import Image

    with ResultsStore(report_store) as store:
        page = render_report(store, "a", "b")
        rows = {run: list(store.verdicts(run)) for run in ("a", "b")}
        metrics = {
            run: compute_metrics(store.problems(run), store.samples(run)) for run in ("a", "b")
        }
    # five plots, each a decodable PNG inside its figure
    for key in PLOTS:
        found = re.search(rf'<figure id="plot-{key}">.*?</figure>', page, re.S)
        assert found, key
        img = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', found.group(0))
        assert img, key
        with Image.open(io.BytesIO(base64.b64decode(img.group(1)))) as im:
            assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 200
    # self-contained: nothing to fetch, no script
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    assert "<script" not in page.lower() and "default-src 'none'" in page
    # the metrics tables carry the metrics module's numbers
    for run in ("a", "b"):
        (g,) = metrics[run]
        pct = [(100 * f.wins, 100 * f.ties, 100 * f.losses) for f in g.fast_p]
        cells = [f"{w:.1f} / {t:.1f} / {lo:.1f}" for w, t, lo in pct]
        assert all(c in page for c in cells[1:]), cells
    assert "Per level" in page and "level 2" in page and "tag reduction" in page
    # one section per candidate, linked from the index
    for run, anchor in (("a", "run1"), ("b", "run2")):
        for r in rows[run]:
            assert f'id="{anchor}-v{r.id}"' in page and f'href="#{anchor}-v{r.id}"' in page
    # the candidate's attempt to end the <pre> and run a script is text
    assert SCRIPT_IN_SOURCE not in page
    assert "# &lt;/pre&gt;&lt;script&gt;window.__pwned = 1&lt;/script&gt;&lt;pre&gt;" in page
    # the episode's transcript: messages, the tool call's code, the tool's result
    assert "Make it fast &lt;b&gt;please&lt;/b&gt;." in page
    assert "tool call <b>submit_kernel</b>" in page and "correct: 5/5" in page
    # the roofline says which timed candidates it leaves out, and that CPUs have no peaks
    assert "Not on the roofline (a): scale/same: the problem gives no FLOP count." in page
    assert "no roof is drawn" in page
    # the per-problem comparison
    table = page[page.index('id="comparison"') :]
    assert re.search(r"rownorm</td>.*?only a correct", table, re.S)
    assert re.search(r"scale</td>.*?no candidate.*?only a correct", table, re.S)


def test_comparison_of_two_best_candidates_follows_the_intervals(report_store: Path) -> None:
    with ResultsStore(report_store) as store:
        row = next(r for r in store.verdicts("a") if r.status == "correct" and r.speedup)
        wrong = next(r for r in store.verdicts("a") if r.status == "incorrect")

    def timed(lo: float, hi: float) -> object:
        return dataclasses.replace(row, speedup=(lo + hi) / 2, speedup_lo=lo, speedup_hi=hi)

    assert compare_problem(timed(1.0, 1.2), timed(1.3, 1.5)) == "b faster"
    assert compare_problem(timed(2.0, 2.2), timed(1.3, 1.5)) == "a faster"
    assert compare_problem(timed(1.0, 1.4), timed(1.3, 1.5)) == "tie"
    assert compare_problem(timed(1.0, 1.4), wrong) == "only a correct"
    assert compare_problem(None, timed(1.0, 1.4)) == "only b correct"
    assert compare_problem(wrong, None) == "neither correct"
    untimed = dataclasses.replace(row, speedup=None, speedup_lo=None, speedup_hi=None)
    assert compare_problem(untimed, timed(1.0, 1.1)) == "both correct, not timed"


def _cli(*args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{pre}\nfrom kerneljudge.cli.app import main\nsys.argv = ['kerneljudge']\n"
    code += f"sys.argv += {list(args)!r}\nmain()\n"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def test_report_command_writes_the_file_and_fails_in_one_line(
    report_store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sub" / "r.html"
    done = _cli("report", "a", "--store", str(report_store), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("<!DOCTYPE html>") and f"report -> {out}" in done.stderr
    missing = _cli("report", "nope", "--store", str(report_store), "--out", str(out))
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0
    assert "no run 'nope'" in missing.stderr
    no_mpl = _cli(
        "report", "a", "--store", str(report_store), pre="sys.modules['matplotlib'] = None"
    )
    assert no_mpl.returncode == 2 and no_mpl.stderr.strip().count("\n") == 0, no_mpl.stderr
    assert "pip install 'kerneljudge[report]'" in no_mpl.stderr


def test_write_report_names_the_file_after_the_runs(
    report_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with ResultsStore(report_store) as store:
        path = write_report(store, "latest", "a")
    assert path == Path("report-b-vs-a.html") and (tmp_path / path).stat().st_size > 10_000
