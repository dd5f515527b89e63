"""The suite's speedup rule on hand-made rows: a `correct` cheat is FOOLED when its launched or
its graph-replay speedup is past `speedup_max_vs_baseline` times the honest baseline's."""

from __future__ import annotations

from run_suite import Row, apply_speedup_rule


def _row(speedup: float | None, graph: float | None) -> Row:
    return Row(
        file="gpu/x.py",
        kind="cheat",
        expected="correct|rejected",
        got="correct",
        reason="",
        outcome="OK",
        speedup=speedup,
        graph_speedup=graph,
        speedup_max=3.0,
    )


def test_a_faked_replay_speedup_is_fooled_even_when_the_launched_one_is_not() -> None:
    row = _row(2.0, 40.0)
    apply_speedup_rule(row, [1.0, 1.1, 0.9], [1.0, 1.0, 1.0])
    assert row.outcome == "FOOLED" and "graph replay speedup 40x" in row.notes[0]


def test_within_the_factor_on_both_is_ok_and_no_replays_is_not_judged() -> None:
    row = _row(2.0, 2.5)
    apply_speedup_rule(row, [1.0], [1.0])
    assert row.outcome == "OK" and row.baseline_speedup == 1.0
    cpu = _row(2.0, None)
    apply_speedup_rule(cpu, [1.0], [])
    assert cpu.outcome == "OK"
    launched = _row(9.0, None)
    apply_speedup_rule(launched, [1.0])
    assert launched.outcome == "FOOLED"
