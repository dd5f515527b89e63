"""Interpreters started ahead of any problem (kerneljudge.worker.spares): a new judge takes its
probe, its reference worker and its candidate worker from them, each spare is used once, a dead
one is never handed out, and they are stopped while a candidate is judged."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from kerneljudge.errors import ProblemError
from kerneljudge.executors._warm import WarmJudges
from kerneljudge.executors.base import Job
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.problem.probe import ProbeChild
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.faults import WorkerDied
from kerneljudge.worker.sandbox import child_pids
from kerneljudge.worker.spares import Spares

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {factor}

def get_inputs():
    {inputs}

def get_init_inputs():
    return []
"""
CONFIG = JudgeConfig(device="cpu", timing=False, trials=2)


def _problem(folder: Path, name: str, factor: int = 2, inputs: str = "") -> tuple[Path, Path]:
    """A problem file and its identity candidate."""
    text = PROBLEM.format(factor=factor, inputs=inputs or "return [torch.randn(64, 64)]")
    problem = folder / f"{name}.py"
    problem.write_text(textwrap.dedent(text))
    candidate = folder / f"{name}_candidate.py"
    candidate.write_text(problem.read_text().replace("class Model", "class ModelNew"))
    return problem, candidate


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _kinds(spares: Spares) -> list[str]:
    return sorted(
        "probe" if isinstance(s, ProbeChild) else s.role  # type: ignore[attr-defined]
        for s in spares.kept()
    )


@pytest.fixture
def spares():
    kept = Spares()
    yield kept
    kept.close()


def test_a_new_judge_takes_its_probe_and_workers_from_the_spares_and_uses_each_once(
    tmp_path: Path, spares: Spares
) -> None:
    first, first_candidate = _problem(tmp_path, "first")
    with Judge(first, CONFIG, spares=spares) as judge:
        assert judge.evaluate(first_candidate).status == "correct"
    assert spares.kept() == []  # none was started ahead: each was started when taken
    spares.refill()
    spares.wait_ready()
    assert _kinds(spares) == ["candidate", "probe", "reference"]
    taken = [s.proc.pid for s in spares.kept()]  # type: ignore[attr-defined]

    second, second_candidate = _problem(tmp_path, "second", factor=3)
    with Judge(second, CONFIG, spares=spares) as judge:
        assert spares.kept() == []  # all three taken by the new judge
        verdict = judge.evaluate(second_candidate)
    assert verdict.status == "correct", verdict.note
    assert all(_ended(pid) for pid in taken)  # each ended with the judge that took it
    spares.refill()
    assert not {s.proc.pid for s in spares.kept()} & set(taken)  # type: ignore[attr-defined]


def test_a_spare_that_died_is_never_handed_out(tmp_path: Path, spares: Spares) -> None:
    problem, candidate = _problem(tmp_path, "p")
    other, other_candidate = _problem(tmp_path, "other", factor=5)
    with Judge(problem, CONFIG, spares=spares) as judge:
        judge.evaluate(candidate)
    spares.refill()
    spares.wait_ready()
    dead = [s for s in spares.kept() if isinstance(s, WorkerProcess) and s.role == "reference"]
    os.killpg(dead[0].proc.pid, signal.SIGKILL)
    dead[0].proc.wait()
    with Judge(other, CONFIG, spares=spares) as judge:
        verdict = judge.evaluate(other_candidate)
    assert verdict.status == "correct", verdict.note


def test_a_spare_probe_reports_the_problems_failure_as_a_fresh_one_does(
    tmp_path: Path, spares: Spares
) -> None:
    good, _ = _problem(tmp_path, "good")
    bad, _ = _problem(tmp_path, "bad", inputs="raise ValueError('no inputs today')")
    Judge(good, CONFIG, spares=spares).close()
    spares.refill()
    spares.wait_ready()
    probe = next(s for s in spares.kept() if isinstance(s, ProbeChild))
    with pytest.raises(ProblemError, match="calling get_inputs raised ValueError: no inputs"):
        Judge(bad, CONFIG, spares=spares)
    assert _ended(probe.proc.pid)
    assert not Path(probe.result).parent.exists()  # its folder went with it


def test_spares_are_stopped_while_a_candidate_is_judged(tmp_path: Path, spares: Spares) -> None:
    problem, candidate = _problem(tmp_path, "p")
    seen: list[str] = []

    def pids() -> list[int]:
        return [
            pid
            for s in spares.kept()
            for pid in [s.proc.pid, *child_pids(s.proc.pid)]  # type: ignore[attr-defined]
        ]

    with Judge(problem, CONFIG, spares=spares) as judge:
        spares.refill()  # kept beside this judge while it judges
        spares.wait_ready()

        def progress(line: str) -> None:
            if line.startswith("trial"):
                seen.extend(_state(pid) for pid in pids())

        judge.progress = progress
        assert judge.evaluate(candidate).status == "correct"
    assert len(seen) >= 2 and set(seen) == {"T"}, seen
    assert all(_state(pid) != "T" for pid in pids())  # running again once the verdict ended


def test_a_host_keeps_spares_after_a_job_and_judges_a_new_problem_with_them(
    tmp_path: Path,
) -> None:
    problems = [_problem(tmp_path, f"p{i}", factor=i + 2) for i in range(2)]
    host = WarmJudges("cpu", max_judges=2)
    try:
        for problem, candidate in problems:
            job = Job(str(problem), candidate.read_text(), JudgeOptions())
            outcome = host.run(job.to_dict(), lambda _: CONFIG)
            host.refill()
            assert outcome.verdict is not None, outcome.message
            assert outcome.verdict.status == "correct"
            assert host.spares is not None
            assert _kinds(host.spares) == ["candidate", "probe", "reference"]
        kept = [s.proc.pid for s in host.spares.kept()]  # type: ignore[attr-defined]
    finally:
        host.close()
    assert all(_ended(pid) for pid in kept)


class _Fake:
    """A stand-in process: records how it was started, never runs anything."""

    def __init__(self, **started: object) -> None:
        self.started, self.closed, self.dead = started, False, False

    def alive(self) -> bool:
        return not self.dead

    def pause(self, paused: bool) -> None:
        pass

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_kind_keeps_its_first_start_and_the_least_recently_taken_kind_ends_first() -> None:
    spares = Spares(max_kinds=2)
    spares.take("a", lambda: _Fake(kind="a"))
    spares.take("a", lambda: _Fake(kind="not a"))  # a later start never replaces the first
    spares.take("b", lambda: _Fake(kind="b"), count=2)
    spares.refill()
    assert sorted(s.started["kind"] for s in spares.kept()) == ["a", "b", "b"]  # type: ignore[attr-defined]
    kept_a = [s for s in spares.kept() if s.started["kind"] == "a"]  # type: ignore[attr-defined]
    spares.take("c", lambda: _Fake(kind="c"))  # a third kind: "a", taken least recently, ends
    assert kept_a[0].closed  # type: ignore[attr-defined]
    spares.refill()
    assert sorted(s.started["kind"] for s in spares.kept()) == ["b", "b", "c"]  # type: ignore[attr-defined]
    spares.close()
    assert spares.kept() == []
    spares.refill()  # nothing once closed
    assert spares.kept() == []


def test_a_pool_that_records_operators_later_never_files_its_workers_under_the_old_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kerneljudge.worker import pool as pool_module

    monkeypatch.setattr(
        pool_module,
        "WorkerProcess",
        lambda *args, **kwargs: _Fake(args=args, **kwargs),
    )
    spares = Spares()
    plain = pool_module.WorkerPool("cpu", spares=spares)
    plain.prestart()
    plain.record_ops = True  # as a judge does once the probe says the problem records
    plain.close()
    plain.prestart()
    spares.refill()
    recording = {s.started["record_ops"] for s in spares.kept()}  # type: ignore[attr-defined]
    assert recording == {True, False}
    other = pool_module.WorkerPool("cpu", spares=spares)  # a judge of a problem that does not
    other.prestart()
    assert other._idle[0].started["record_ops"] is False  # type: ignore[attr-defined]
    spares.close()


def test_a_spare_probe_that_died_before_it_was_given_the_problem_is_not_blamed_on_it(
    tmp_path: Path, spares: Spares, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = _problem(tmp_path, "first")
    second, second_candidate = _problem(tmp_path, "second", factor=3)
    Judge(first, CONFIG, spares=spares).close()
    spares.refill()
    spares.wait_ready()
    taken = spares.take
    killed: list[int] = []

    def take_and_kill(key, start, count=1, now=None):  # type: ignore[no-untyped-def]
        spare = taken(key, start, count, now)
        if isinstance(spare, ProbeChild):  # it dies after it was taken, before it reads
            os.killpg(spare.proc.pid, signal.SIGKILL)
            spare.proc.wait()
            killed.append(spare.proc.pid)
        return spare

    monkeypatch.setattr(spares, "take", take_and_kill)
    with Judge(second, CONFIG, spares=spares) as judge:  # probed again by a fresh child
        assert judge.evaluate(second_candidate).status == "correct"
    assert killed


class _Stuck(_Fake):
    """A worker whose start-up wait is stopped: by ``error`` (a dead worker, a Ctrl-C)."""

    def __init__(self, error: BaseException, **started: object) -> None:
        super().__init__(**started)
        self.error = error

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        raise self.error


@pytest.mark.parametrize(
    "errors",  # the wait of each worker started, in order (None: it comes up)
    [
        [KeyboardInterrupt()],  # Ctrl-C or SIGTERM while the worker still imports torch
        # the one taken dies, its replacement ahead of need is fine, the one in its place dies
        [WorkerDied(None, "gone"), None, WorkerDied(None, "gone again")],
    ],
)
def test_a_worker_taken_from_the_pool_is_closed_when_its_wait_is_stopped(
    monkeypatch: pytest.MonkeyPatch, errors: list[BaseException | None]
) -> None:
    from kerneljudge.worker import pool as pool_module

    started: list[_Fake] = []

    def start(*args: object, **kwargs: object) -> _Fake:
        error = errors[len(started)] if len(started) < len(errors) else None
        fake = _Stuck(error, args=args) if error else _Fake(args=args)
        started.append(fake)
        return fake

    monkeypatch.setattr(pool_module, "WorkerProcess", start)
    pool = pool_module.WorkerPool("cpu")
    with pytest.raises(type(errors[-1])):
        pool.take()
    stuck = [w for w in started if isinstance(w, _Stuck)]
    assert len(stuck) == sum(e is not None for e in errors) and all(w.closed for w in stuck)
    pool.close()
    assert all(w.closed for w in started)
