"""Suite runs: judge every (problem, candidate) pair of a suite and store each verdict.

A run is planned from its *spec* (the suite, the candidates folder, the layout and the judge
options, stored with the run), so a resumed run plans the same pairs again and judges those
without a stored verdict. The store keeps every pair a run planned: a pair added to the folder
joins the plan at the next resume, a pair once planned or judged stays in it (one removed before
it was judged is left undone, :attr:`RunPlan.missing`), so a run never has more verdicts than
planned pairs. Each problem gets one warm :class:`~kerneljudge.judge.Judge` for all
its candidates, made from processes started while the problem before it was judged
(:mod:`kerneljudge.worker.spares`); each verdict is committed before the next pair starts, so
a run stopped at any moment (Ctrl-C, ``kill -9``, a power cut) loses at most the pair in
flight.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kerneljudge.candidate import Candidate
from kerneljudge.errors import CandidateError, DeviceError, KernelJudgeError, ProblemError
from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.stopping import StopSignals
from kerneljudge.suite.layout import Pair, SuiteProblem, find_candidates, load_suite
from kerneljudge.suite.store import ResultsStore, StoreError
from kerneljudge.worker.spares import Spares

__all__ = [
    "RunPlan",
    "RunSummary",
    "SuiteOptions",
    "host_versions",
    "plan",
    "plan_run",
    "release",
    "run_pairs",
    "start_run",
]


#: The judge's options for every pair of a run (stored with it; a resume reuses them).
SuiteOptions = JudgeOptions


@dataclass
class RunSummary:
    """What one call of :func:`run_pairs` did.

    Attributes:
        planned: pairs in the run's plan (:class:`RunPlan`); already: of those, pairs done
            before this call; judged: verdicts stored by this call; not_judged: pair label ->
            why it was left for a later resume (a harness error: no GPU for a CUDA candidate,
            an unreadable file, a failing reference; or a planned pair whose file is gone);
            statuses: status -> count of this call's verdicts.
    """

    run_id: str
    planned: int = 0
    already: int = 0
    judged: int = 0
    not_judged: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    interrupted: bool = False


def host_versions() -> dict[str, str]:
    """kerneljudge, Python, torch and CUDA (torch's build) versions of this process."""
    import platform

    import torch

    from kerneljudge import __version__

    return {
        "kerneljudge": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(owner: str) -> bool:
    """Whether ``host:pid`` names a live process on this host (other than this one)."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def plan(spec: dict[str, Any]) -> tuple[list[SuiteProblem], list[Pair], list[Path]]:
    """The problems, pairs and unmatched candidate files of a run spec.

    Raises:
        KernelJudgeError: the suite or candidates folder is unusable (see
            :func:`~kerneljudge.suite.layout.load_suite`, :func:`find_candidates`).
    """
    problems = load_suite(spec["suite"])
    pairs, unmatched = find_candidates(
        Path(spec["candidates"]), problems, spec.get("layout", "auto")
    )
    return problems, pairs, unmatched


@dataclass
class RunPlan:
    """What a run judges: its suite's ``problems``, the candidate folder's ``pairs`` now and the
    files that match no problem (``unmatched``), the run's whole plan (``planned``: every pair
    planned or judged in it before, and the folder's pairs now; ``(problem, sample)`` -> the
    candidate file) and the pairs with a stored verdict (``done``)."""

    problems: list[SuiteProblem]
    pairs: list[Pair]
    unmatched: list[Path]
    planned: dict[tuple[str, str], str]
    done: set[tuple[str, str]]

    @property
    def todo(self) -> list[Pair]:
        """The folder's pairs without a stored verdict, in plan order."""
        return [p for p in self.pairs if p.key not in self.done]

    @property
    def missing(self) -> dict[str, str]:
        """The planned pairs that have no verdict and are no longer in the folder (or whose
        problem is no longer in the suite): ``problem/sample`` -> why they cannot be judged."""
        now = {p.key for p in self.pairs}
        names = {p.name for p in self.problems}
        out = {}
        for (problem, sample), path in self.planned.items():
            if (problem, sample) in now or (problem, sample) in self.done:
                continue
            out[f"{problem}/{sample}"] = (
                f"its candidate file {path} is no longer in the candidates folder"
                if problem in names
                else f"its problem {problem} is no longer in the suite"
            )
        return out


def plan_run(store: ResultsStore, run_id: str, spec: dict[str, Any]) -> RunPlan:
    """The plan of run ``run_id`` (of ``spec``) from its suite and candidates folder now and
    what ``store`` holds of it, writing nothing: a pair once planned or judged stays in the
    plan, a pair added to the folder joins it.

    Raises:
        KernelJudgeError: as :func:`plan`.
    """
    problems, pairs, unmatched = plan(spec)
    planned = store.planned(run_id)
    done = store.done(run_id)
    for p in pairs:
        planned.setdefault(p.key, str(p.path))
    for key in done:  # a verdict stored without its planned row (by an older kerneljudge)
        planned.setdefault(key, "")
    return RunPlan(problems, pairs, unmatched, planned, done)


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-xxxx``: UTC time of creation and 4 random hex digits."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def start_run(
    store: ResultsStore,
    *,
    suite: list[str],
    candidates: Path,
    layout: str = "auto",
    options: SuiteOptions | None = None,
    run_id: str | None = None,
    model: str = "",
    sampling: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """Plan a new run, record it and its problems in ``store``; return its id.

    Raises:
        KernelJudgeError: the suite or candidates are unusable; StoreError: the id is taken.
    """
    options = options or SuiteOptions()
    suite = [s if s == "bundled" or not Path(s).exists() else str(Path(s).resolve()) for s in suite]
    spec = {
        "suite": suite,
        "candidates": str(candidates.resolve()),
        "layout": layout,
        "options": asdict(options),
    }
    problems, pairs, unmatched = plan(spec)
    run_id = run_id or new_run_id()
    store.create_run(
        run_id,
        spec=spec,
        model=model,
        sampling=sampling,
        metadata=metadata,
        device=options.device,
        versions=host_versions(),
        owner=_owner(),
    )
    _record_plan(store, run_id, RunPlan(problems, pairs, unmatched, {}, set()))
    return run_id


def _record_plan(store: ResultsStore, run_id: str, run_plan: RunPlan) -> None:
    """Store the plan's problems and add the folder's pairs to the run's planned pairs."""
    counts: dict[str, int] = {}
    for problem, _ in {**run_plan.planned, **{p.key: "" for p in run_plan.pairs}}:
        counts[problem] = counts.get(problem, 0) + 1
    store.set_problems(run_id, [p.to_dict(counts.get(p.name, 0)) for p in run_plan.problems])
    store.add_planned(run_id, [(p.problem.name, p.sample, str(p.path)) for p in run_plan.pairs])


def release(store: ResultsStore, run: str) -> None:
    """Mark run ``run`` ``interrupted`` where it is ``running`` under this process: a run
    stopped before :func:`run_pairs` took it (while it was planned), which would otherwise
    stay ``running``; nothing for a run not stored yet."""
    try:
        info = store.run(run)
    except StoreError:
        return
    if info.state == "running" and info.owner == _owner():
        store.set_state(info.run_id, "interrupted")


Reporter = Callable[[str, Pair | None, Any], None]
"""``reporter(event, pair, data)``: ``start`` (data: (pairs to judge, already done)), ``pair``
(a pair begins; data None), ``verdict`` (data: the Verdict), ``skip`` (data: why), ``end``."""


def run_pairs(store: ResultsStore, run: str, reporter: Reporter | None = None) -> RunSummary:
    """Judge the pairs of run ``run`` that have no stored verdict yet, storing each verdict.

    The run's state is ``running`` while this works; then ``finished`` when every planned pair
    has a verdict, ``incomplete`` when it went through its plan but left pairs undone (they
    cannot be judged here: :attr:`RunSummary.not_judged`; a resume where they can finishes
    it), ``interrupted`` when it was stopped before the end (Ctrl-C, SIGTERM, SIGHUP, a
    harness failure).

    Raises:
        StoreError: no such run, or another live process on this host is running it.
        KernelJudgeError: the suite or candidates folder is unusable.
        KeyboardInterrupt: passed on after the run is marked ``interrupted``.
    """
    info = store.run(run)
    run_id = info.run_id
    if info.state == "running" and _alive(info.owner):
        raise StoreError(f"run {run_id} is being judged by process {info.owner}")
    run_plan = plan_run(store, run_id, info.spec)
    _record_plan(store, run_id, run_plan)
    options = SuiteOptions.from_dict(info.spec.get("options", {}))
    config = options.judge_config()
    todo = run_plan.todo
    summary = RunSummary(
        run_id, planned=len(run_plan.planned), already=len(run_plan.done & run_plan.planned.keys())
    )
    summary.unmatched = [str(p) for p in run_plan.unmatched]
    summary.not_judged.update(run_plan.missing)
    report = reporter or (lambda *a: None)
    store.set_state(run_id, "running", owner=_owner())
    by_problem: dict[str, list[Pair]] = {}
    for p in todo:
        by_problem.setdefault(p.problem.name, []).append(p)
    spares = Spares()  # the next problem's processes start while this one's pairs are judged
    try:
        with StopSignals() as stop, contextlib.closing(spares):
            report("start", None, (len(todo), summary.already))
            for group in by_problem.values():
                _judge_problem(store, run_id, group, config, summary, report, stop, spares)
    except BaseException as exc:  # Ctrl-C, or a harness failure: the run stays resumable
        summary.interrupted = isinstance(exc, KeyboardInterrupt)
        store.set_state(run_id, "interrupted")
        raise
    finished = store.done(run_id) >= set(run_plan.planned)
    store.set_state(run_id, "finished" if finished else "incomplete")
    report("end", None, summary)
    return summary


def _judge_problem(
    store: ResultsStore,
    run_id: str,
    group: list[Pair],
    config: JudgeConfig,
    summary: RunSummary,
    report: Reporter,
    stop: StopSignals,
    spares: Spares,
) -> None:
    """Judge one problem's pending pairs with one warm judge, its processes taken from
    ``spares`` (refilled once it is up, for the next problem); a Ctrl-C is honoured between
    pairs even if its KeyboardInterrupt was lost."""
    problem = group[0].problem

    def skip(pair: Pair, why: str) -> None:
        summary.not_judged[f"{pair.problem.name}/{pair.sample}"] = why
        report("skip", pair, why)

    try:
        judge = Judge(problem.path, config, spares=spares)
    except ProblemError as exc:
        for pair in group:
            skip(pair, f"problem failed to load: {exc}")
        return
    spares.refill()
    with judge:
        for i, pair in enumerate(group):
            stop.check()
            report("pair", pair, None)
            try:
                cand = Candidate.from_file(pair.path)
                t0 = time.monotonic()
                verdict = judge.evaluate(cand)
            except (CandidateError, DeviceError) as exc:
                skip(pair, str(exc))
                continue
            except ProblemError as exc:
                for rest in group[i:]:
                    skip(rest, f"the reference failed: {exc}")
                return
            except KernelJudgeError as exc:  # a harness failure: leave the pair for a resume
                skip(pair, f"{type(exc).__name__}: {exc}")
                continue
            store.add_verdict(
                run_id,
                problem=problem.name,
                sample=pair.sample,
                source=cand.source,
                verdict=verdict,
                level=problem.level,
                tags=problem.tags,
                candidate_path=str(pair.path),
            )
            summary.judged += 1
            status = verdict.status.value
            summary.statuses[status] = summary.statuses.get(status, 0) + 1
            report("verdict", pair, (verdict, time.monotonic() - t0))
