"""The results store: verdicts round-trip, a done pair cannot be stored twice, runs resolve by
prefix, episode transcripts, exports, and a file of schema version 1 migrates to the latest."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kerneljudge.cli.app import app
from kerneljudge.suite.migrations import LATEST, migrate
from kerneljudge.suite.store import ResultsStore, StoreError
from kerneljudge.verdict import Measurement, Speedup, Status, TimingResult, Verdict


def _verdict(status: Status, speedup: tuple[float, float, float] | None = None) -> Verdict:
    timing = None
    if speedup is not None:
        med, lo, hi = speedup
        m = Measurement("candidate", 20, 1.0, 0.9, 1.1, 0.8, 1.0, (0.95, 1.05))
        timing = TimingResult(
            clock="monotonic",
            measurements=(m,),
            speedups=(Speedup("eager", med, (lo, hi)),),
            rounds=8,
            stop_reason="max_time",
        )
    return Verdict(
        status=status,
        reason="" if status is Status.CORRECT else "wrong output",
        problem="p",
        candidate_sha256="0" * 64,
        backend="cpp",
        timing=timing,
        versions={"torch": "2.x", "kerneljudge": "0.1.0"},
    )


def _run(store: ResultsStore, run_id: str = "r1") -> None:
    store.create_run(
        run_id, spec={"suite": ["x"]}, model="m", sampling={"temperature": 0.7}, metadata={"a": 1}
    )
    store.set_problems(
        run_id,
        [
            {"problem": "p", "level": 1, "tags": ["t"], "planned": 2},
            {"problem": "q", "level": 2, "tags": [], "planned": 0},
        ],
    )


def test_verdicts_round_trip_and_a_pair_is_stored_once(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        assert store.version == LATEST
        _run(store)
        v = _verdict(Status.CORRECT, (1.4, 1.1, 1.9))
        vid = store.add_verdict(
            "r1", problem="p", sample="0", source="src", verdict=v, level=1, tags=("t",)
        )
        store.add_verdict(
            "r1", problem="p", sample="1", source="s2", verdict=_verdict(Status.INCORRECT)
        )
        with pytest.raises(StoreError, match="already has a verdict"):
            store.add_verdict("r1", problem="p", sample="0", source="src", verdict=v)
        rows = list(store.verdicts("r1"))
        assert [r.id for r in rows][0] == vid and len(rows) == 2
        assert rows[0].verdict == v  # the full verdict comes back typed
        assert rows[0].candidate_sha256 == __import__("hashlib").sha256(b"src").hexdigest()
        assert (rows[0].speedup, rows[0].speedup_lo, rows[0].speedup_hi) == (1.4, 1.1, 1.9)
        assert rows[1].speedup is None and rows[1].status == "incorrect"
        assert store.done("r1") == {("p", "0"), ("p", "1")}
        info = store.run("r1")
        assert (info.planned, info.judged, info.correct) == (2, 2, 1)
        assert info.sampling == {"temperature": 0.7} and info.metadata == {"a": 1}
        assert store.problems("r1") == {"p": (1, ("t",)), "q": (2, ())}
        samples = store.samples("r1")
        assert samples[0].ci95 == (1.1, 1.9) and samples[1].ci95 is None


def test_runs_resolve_by_id_prefix_and_latest(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        _run(store, "20260101-a")
        _run(store, "20260102-b")
        assert store.resolve("20260101") == "20260101-a"
        assert store.resolve("latest") == "20260102-b"
        with pytest.raises(StoreError, match="matches 2 runs"):
            store.resolve("2026")
        with pytest.raises(StoreError, match="no run"):
            store.resolve("x")
        with pytest.raises(StoreError, match="already in"):
            _run(store, "20260101-a")


def test_an_episode_transcript_is_stored_with_its_verdict(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        _run(store)
        transcript = [{"role": "user", "content": "write a kernel"}, {"tool": "submit_kernel"}]
        store.add_verdict(
            "r1",
            problem="p",
            sample="ep0",
            source="s",
            verdict=_verdict(Status.CORRECT),
            transcript=transcript,
            summary={"reward": 1.0},
        )
        store.add_verdict(
            "r1", problem="p", sample="plain", source="s", verdict=_verdict(Status.CORRECT)
        )
        by_sample = {r.sample: r for r in store.verdicts("r1")}
        assert by_sample["ep0"].transcript == transcript
        assert by_sample["plain"].transcript is None


def _v1_file(path: Path) -> None:
    """A store as version 1 wrote it: no speedup columns, no episodes table."""
    db = sqlite3.connect(path, isolation_level=None)
    assert migrate(db, target=1) == 1
    verdict = _verdict(Status.CORRECT, (2.5, 2.0, 3.0)).to_dict()
    db.execute(
        "INSERT INTO runs (run_id, created_at, updated_at, state) "
        "VALUES ('old', 't', 't', 'finished')"
    )
    db.execute(
        "INSERT INTO verdicts (run_id, problem, sample, candidate_source, candidate_sha256, "
        "status, verdict, stored_at) VALUES ('old', 'p', '0', 'src', 'h', 'correct', ?, 't')",
        (json.dumps(verdict),),
    )
    columns = {row[1] for row in db.execute("PRAGMA table_info(verdicts)")}
    assert "speedup" not in columns
    db.close()


def test_a_version_1_file_migrates_and_keeps_its_verdicts(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v1_file(path)
    with ResultsStore(path) as store:
        assert store.version == LATEST
        (row,) = store.verdicts("old")
        # Step 2 filled the new columns from the stored verdict JSON.
        assert (row.speedup, row.speedup_lo, row.speedup_hi) == (2.5, 2.0, 3.0)
        assert row.verdict.status is Status.CORRECT
        store.add_verdict(
            "old",
            problem="p",
            sample="1",
            source="s",
            verdict=_verdict(Status.CORRECT),
            transcript=[],
        )
    db = sqlite3.connect(path)
    versions = [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, LATEST + 1))
    db.close()


def test_a_version_2_file_gets_its_judged_pairs_as_planned(tmp_path: Path) -> None:
    """Step 3 plans each stored verdict's pair and raises a problem's planned count to its
    judged pairs where it was lower; a higher count (pairs planned, not judged) is kept."""
    path = tmp_path / "v2.db"
    db = sqlite3.connect(path, isolation_level=None)
    assert migrate(db, target=2) == 2
    db.execute(
        "INSERT INTO runs (run_id, created_at, updated_at, state) VALUES ('r', 't', 't', 'x')"
    )
    for problem, planned in (("p", 1), ("q", 5)):
        db.execute(
            "INSERT INTO run_problems (run_id, problem, planned) VALUES ('r', ?, ?)",
            (problem, planned),
        )
    verdict = json.dumps(_verdict(Status.CORRECT).to_dict())
    for problem, sample in (("p", "0"), ("p", "1"), ("q", "0")):
        db.execute(
            "INSERT INTO verdicts (run_id, problem, sample, candidate_path, candidate_source, "
            "candidate_sha256, status, verdict, stored_at) VALUES ('r', ?, ?, ?, 's', 'h', "
            "'correct', ?, 't')",
            (problem, sample, f"/c/{problem}/{sample}.py", verdict),
        )
    db.close()
    with ResultsStore(path) as store:
        assert store.version == LATEST
        assert store.planned("r") == {
            ("p", "0"): "/c/p/0.py",
            ("p", "1"): "/c/p/1.py",
            ("q", "0"): "/c/q/0.py",
        }
        info = store.run("r")
        assert (info.planned, info.judged) == (7, 3)  # p: 2 (was 1), q: 5


def test_a_pair_once_planned_stays_planned_and_a_verdict_plans_its_pair(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.db") as store:
        _run(store)  # p planned 2, q planned 0
        store.add_planned("r1", [("p", "a", "/a.py"), ("p", "b", "/b.py")])
        store.set_problems("r1", [{"problem": "p", "level": 1, "planned": 1}])  # never lower
        assert store.run("r1").planned == 2
        store.add_verdict(
            "r1", problem="q", sample="x", source="s", verdict=_verdict(Status.CORRECT)
        )
        assert set(store.planned("r1")) == {("p", "a"), ("p", "b"), ("q", "x")}
        info = store.run("r1")
        assert (info.planned, info.judged) == (3, 1)


def test_a_newer_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    ResultsStore(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_version VALUES (?, 't')", (LATEST + 1,))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer than this kerneljudge supports"):
        ResultsStore(path)


def test_export_jsonl_and_parquet(tmp_path: Path) -> None:
    db_path = tmp_path / "r.db"
    with ResultsStore(db_path) as store:
        _run(store)
        store.add_verdict(
            "r1",
            problem="p",
            sample="0",
            source="src",
            verdict=_verdict(Status.CORRECT, (1.2, 1.0, 1.5)),
        )
    runner = CliRunner()
    out = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["results", "export", "r1", "--store", str(db_path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    (line,) = out.read_text().splitlines()
    record = json.loads(line)
    assert record["model"] == "m" and record["sampling"] == {"temperature": 0.7}
    assert record["verdict"]["status"] == "correct" and record["candidate_source"] == "src"
    pq_out = tmp_path / "r.parquet"
    res = runner.invoke(
        app,
        ["results", "export", "r1", "--store", str(db_path), "-f", "parquet", "-o", str(pq_out)],
    )
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert res.exit_code == 2
        assert "pip install 'kerneljudge[parquet]'" in res.output
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    else:
        assert res.exit_code == 0, res.output
        table = pq.read_table(pq_out)
        assert table.column("status").to_pylist() == ["correct"]
        assert table.column("speedup").to_pylist() == [1.2]


def test_results_commands_print_and_fail_in_one_line(tmp_path: Path) -> None:
    db_path = tmp_path / "r.db"
    with ResultsStore(db_path) as store:
        _run(store)
        store.add_verdict(
            "r1",
            problem="p",
            sample="0",
            source="s",
            verdict=_verdict(Status.CORRECT, (1.2, 0.9, 1.5)),
        )
    runner = CliRunner()
    res = runner.invoke(app, ["results", "metrics", "r1", "--store", str(db_path), "--json"])
    assert res.exit_code == 0, res.output
    (group,) = json.loads(res.output)["groups"]
    # p: correct with CI (0.9, 1.5) -> tie at p=1; q has no candidate -> counts as a failure
    assert group["correctness"] == 0.5
    assert group["fast_p"][1]["ties"] == 0.5 and group["fast_p"][1]["wins"] == 0.0
    for cmd in (["runs"], ["show", "r1"], ["metrics", "r1", "--by", "level"]):
        res = runner.invoke(app, ["results", *cmd, "--store", str(db_path)])
        assert res.exit_code == 0, (cmd, res.output)
    res = runner.invoke(app, ["results", "show", "nope", "--store", str(db_path)])
    assert res.exit_code == 2 and "no run 'nope'" in res.output and "Traceback" not in res.output


def test_metrics_read_the_graph_replays_speedups_when_asked(tmp_path: Path) -> None:
    """``--timing graph``: each verdict counts by its CUDA-graph replays' speedup (here a win at
    p=1 where the launched calls' interval holds 1), a verdict without replays by its launched
    calls' (here a loss at p=1.5), and the table says how many did so; an unknown timing is a
    one-line error."""
    from kerneljudge.verdict import GraphTiming

    db_path = tmp_path / "r.db"
    replayed = _verdict(Status.CORRECT, (1.2, 0.9, 1.5))
    assert replayed.timing is not None
    graph = GraphTiming(speedups=(Speedup("eager", 1.1, (1.05, 1.15)),), rounds=2)
    replayed = dataclasses.replace(
        replayed, timing=dataclasses.replace(replayed.timing, graph=graph)
    )
    with ResultsStore(db_path) as store:
        _run(store)
        store.add_verdict("r1", problem="p", sample="0", source="s", verdict=replayed)
        store.add_verdict(
            "r1",
            problem="q",
            sample="0",
            source="t",
            verdict=_verdict(Status.CORRECT, (1.3, 1.2, 1.4)),
        )
        launched = store.samples("r1")
        replays = store.samples("r1", "graph")
        assert [v.replays_missing() for v in store.verdicts("r1")] == [False, True]
        with pytest.raises(ValueError, match="timing must be one of"):
            store.samples("r1", "wall")
    assert [(s.speedup, s.ci95) for s in launched] == [(1.2, (0.9, 1.5)), (1.3, (1.2, 1.4))]
    assert [(s.speedup, s.ci95) for s in replays] == [(1.1, (1.05, 1.15)), (1.3, (1.2, 1.4))]
    runner = CliRunner()
    base = ["results", "metrics", "r1", "--store", str(db_path), "--p", "1,1.5"]
    by_launch = json.loads(runner.invoke(app, [*base, "--json"]).output)
    by_graph = json.loads(runner.invoke(app, [*base, "--json", "--timing", "graph"]).output)
    assert (by_launch["timing"], by_graph["timing"]) == ("launched", "graph")
    assert (by_launch["replays_missing"], by_graph["replays_missing"]) == (0, 1)
    (g_launch,), (g_graph,) = by_launch["groups"], by_graph["groups"]
    fast_1 = [g["fast_p"][0] for g in (g_launch, g_graph)]
    assert [(f["wins"], f["ties"]) for f in fast_1] == [(0.5, 0.5), (1.0, 0.0)]
    assert g_graph["fast_p"][1]["losses"] == 1.0  # p at 1.1 and q's launched 1.2-1.4
    assert g_graph["geomean_speedup"] == pytest.approx((1.1 * 1.3) ** 0.5)
    shown = runner.invoke(app, [*base, "--timing", "graph"], env={"COLUMNS": "300"}).output
    assert "graph-replay speedups; 1 verdict(s) without replays counted by their launched" in shown
    res = runner.invoke(app, [*base, "--timing", "wall"])
    assert res.exit_code == 2 and "--timing must be launched or graph" in res.output


def test_reading_a_store_that_does_not_exist_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """A mistyped ``--store`` is one line naming it, exit 2, for every command that reads
    (the results commands, the report and a resume); neither the file nor its folder is
    made. A new suite run still makes its store."""
    runner = CliRunner()
    for db in (tmp_path / "typo.db", tmp_path / "nodir" / "x.db"):
        for cmd in (
            ["results", "runs"],
            ["results", "show", "latest"],
            ["results", "metrics", "latest"],
            ["results", "export", "latest", "-o", str(tmp_path / "out.jsonl")],
            ["report", "latest", "--out", str(tmp_path / "r.html")],
            ["suite", "run", "--resume", "latest"],
        ):
            res = runner.invoke(app, [*cmd, "--store", str(db)])
            assert res.exit_code == 2, (cmd, res.output)
            assert res.output.strip() == f"error: no results store at {db}", (cmd, res.output)
        assert not db.exists() and db.parent.exists() == (db.parent == tmp_path)
    assert not list(tmp_path.iterdir())
    with pytest.raises(StoreError, match="no results store at"):
        ResultsStore(tmp_path / "typo.db", create=False)
    with ResultsStore(tmp_path / "new" / "r.db") as store:  # a new run's store is made
        assert store.runs() == []


def test_export_makes_the_output_folder(tmp_path: Path) -> None:
    db_path = tmp_path / "r.db"
    with ResultsStore(db_path) as store:
        _run(store)
        store.add_verdict(
            "r1", problem="p", sample="0", source="s", verdict=_verdict(Status.CORRECT)
        )
    out = tmp_path / "a" / "b" / "r1.jsonl"
    res = CliRunner().invoke(
        app, ["results", "export", "r1", "--store", str(db_path), "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["sample"] for line in out.read_text().splitlines()] == ["0"]
    blocked = tmp_path / "r.db" / "x.jsonl"  # its folder is a file
    res = CliRunner().invoke(
        app, ["results", "export", "r1", "--store", str(db_path), "-o", str(blocked)]
    )
    assert res.exit_code == 2 and res.output.startswith(f"error: cannot write {blocked}")
    assert len(res.output.strip().splitlines()) == 1
