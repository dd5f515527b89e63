"""Judge every known-faulty and known-cheating candidate and say which ones fool the judge.

Usage::

    python tests/adversarial/run_suite.py [--gpu] [--no-cpu] [--interleave] [--json OUT]
                                          [--only SUBSTRING ...] [--cache-dir DIR]
                                          [--repeat N] [--load]

``--repeat N`` judges every selected candidate N times (a fresh Judge per problem each round) and
ends with how many rounds each file was OK in; ``--load`` keeps the machine busy meanwhile
(``tests/load/loadgen.py``: 2 x cores busy loops and a memory-bandwidth hog). The CPU part also
runs under pytest: ``tests/adversarial/test_adversarial.py``.

Every candidate file in ``cpu/`` (and ``gpu/`` with ``--gpu``) starts with header comments::

    # expected: <status>[|<status>...]   statuses a correct judge may give (first: preferred)
    # kind: <short description>
    # problem: problem_cpu.py | problem_cpu_policy.py | <bundled name, e.g. causal_gqa>

and optionally::

    # speedup_max_vs_baseline: F   if judged `correct`, its eager speedup must stay within F times
                                   the honest baseline's (else the timer was fooled), and so
                                   must its graph-replay speedup (GPU), the baseline's replays
    # breach_fails: yes            a "breach" the candidate records (see below) is a failure
    # affects_others: yes          always judge the problem's correct baseline right after it
    # fresh_judge: yes             judge it on a fresh Judge (cold reference worker)

Candidates record what they managed to do (a file written outside their scratch directory, a
connection made, a pid started, a secret seen) as JSON lines in ``$KJ_ADV_DIR/<tag>.jsonl``; this
script points ``KJ_ADV_DIR`` at a private temporary folder, sets ``KJ_ADV_ROOT`` (this folder) and
``KJ_ADV_CANARY`` (a random value a candidate must not be able to see), reads the records after
each candidate, and removes the folder at the end.

For each problem the correct baseline (``kind: correct baseline ...``) is judged first; its speedup
is the yardstick of ``speedup_max_vs_baseline``. With ``--interleave`` the baseline is judged again
after every other candidate, on the same Judge, and must stay ``correct``.

Outcome column:
    OK      the status is one of the expected ones, and no other check failed
    FOOLED  judged better than it deserves (``correct`` where it should not be, a timing cheat's
            speedup, a recorded breach)
    WRONG   another status than expected (e.g. ``runtime_error`` for a hang)
    BROKE   Judge.evaluate raised instead of giving a verdict, or the baseline judged after this
            candidate was no longer ``correct``
    LEAK    a process the candidate started was still alive after judging (it is killed)

Exit status: 0 when every row is OK, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# KJ_ADV_SRC: judge with a snapshot of the package (a folder holding kerneljudge/) rather than
# the live tree, e.g. while someone edits src/. Workers follow, since they are started with the
# PYTHONPATH of the package the supervisor imported.
if os.environ.get("KJ_ADV_SRC"):
    sys.path.insert(0, os.environ["KJ_ADV_SRC"])
else:
    try:
        import kerneljudge  # noqa: F401
    except ImportError:  # runnable without an editable install too
        sys.path.insert(0, str(REPO / "src"))

from kerneljudge.judge import Judge, JudgeConfig  # noqa: E402
from kerneljudge.timing import TimingConfig  # noqa: E402

sys.path.insert(0, str(HERE))
from adv_side_effects import (  # noqa: E402
    boot_ticks,
    clear_marks,
    heal_cache,
    kill_pids,
    mark_files,
    marked_alive,
    read_marks,
    resume_references,
    stray_processes,
)

_HEADER = re.compile(r"^#\s*([a-z_]+)\s*:\s*(.*?)\s*$")


@dataclass
class Case:
    """One candidate file and what its header says."""

    path: Path
    expected: tuple[str, ...]
    kind: str
    problem: str
    speedup_max: float | None = None
    breach_fails: bool = False
    affects_others: bool = False
    fresh_judge: bool = False

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def is_baseline(self) -> bool:
        return self.kind.startswith("correct baseline")


@dataclass
class Row:
    """The outcome of judging one candidate."""

    file: str
    kind: str
    expected: str
    got: str
    reason: str
    outcome: str
    notes: list[str] = field(default_factory=list)
    speedup: float | None = None
    baseline_speedup: float | None = None
    speedup_max: float | None = None
    #: the eager speedup of its graph replays (GPU verdicts whose candidate was captured)
    graph_speedup: float | None = None
    problem: str = ""
    seconds: float = 0.0
    verdict: dict[str, Any] | None = None


def parse_case(path: Path) -> Case:
    head: dict[str, str] = {}
    for line in path.read_text().splitlines()[:12]:
        m = _HEADER.match(line)
        if m:
            head.setdefault(m.group(1), m.group(2))
    missing = [k for k in ("expected", "kind", "problem") if k not in head]
    if missing:
        raise SystemExit(f"{path}: header lacks {', '.join(missing)}")
    return Case(
        path=path,
        expected=tuple(s.strip() for s in head["expected"].split("|")),
        kind=head["kind"],
        problem=head["problem"],
        speedup_max=float(head["speedup_max_vs_baseline"])
        if "speedup_max_vs_baseline" in head
        else None,
        breach_fails=head.get("breach_fails", "").lower() == "yes",
        affects_others=head.get("affects_others", "").lower() == "yes",
        fresh_judge=head.get("fresh_judge", "").lower() == "yes",
    )


def problem_spec(case: Case) -> str:
    """A path for the suite's own problems, the bundled name otherwise."""
    local = HERE / case.problem
    return str(local) if local.is_file() else case.problem


def eager_speedup(verdict: Any) -> float | None:
    timing = getattr(verdict, "timing", None)
    if timing is None:
        return None
    for s in timing.speedups:
        if s.baseline == "eager":
            return float(s.median)
    return None


def replay_speedup(verdict: Any) -> float | None:
    """The eager speedup of the verdict's CUDA-graph replays (None where it has none)."""
    graph = getattr(getattr(verdict, "timing", None), "graph", None)
    found = graph.speedup("eager") if graph is not None else None
    return float(found.median) if found is not None else None


def graph_key(problem: str) -> str:
    """The key of a problem's baseline replay speedups in ``Suite.baseline_speedups``."""
    return f"{problem} (graph replay)"


def make_row(
    case: Case, verdict: Any, error: str, seconds: float, base_speedup: float | None
) -> Row:
    """The row of one judging from its verdict (None: ``Judge.evaluate`` raised ``error``):
    ``OK``, ``FOOLED`` (``correct`` where another status was expected), ``WRONG`` or ``BROKE``.
    The speedup rule comes later (:func:`apply_speedup_rule`), so do the candidate's reports
    and left-over processes (:meth:`Suite.judge_one`)."""
    if verdict is None:
        got, reason = "EXCEPTION", error.splitlines()[0]
    else:
        got, reason = verdict.status.value, verdict.reason
    row = Row(
        file=f"{case.path.parent.name}/{case.path.name}",
        kind=case.kind,
        expected="|".join(case.expected),
        got=got,
        reason=reason,
        outcome="OK",
        speedup=eager_speedup(verdict) if verdict is not None else None,
        graph_speedup=replay_speedup(verdict) if verdict is not None else None,
        baseline_speedup=base_speedup,
        seconds=seconds,
        verdict=json.loads(verdict.to_json()) if verdict is not None else None,
        speedup_max=case.speedup_max,
        problem=case.problem,
    )
    if verdict is None:
        row.outcome = "BROKE"
        row.notes.append("Judge.evaluate raised: " + error.splitlines()[0])
    elif got not in case.expected:
        row.outcome = "FOOLED" if got == "correct" else "WRONG"
    return row


# ---------------------------------------------------------------------------- the suite
class Suite:
    def __init__(self, args: argparse.Namespace, adv_dir: Path, cache_dir: Path) -> None:
        self.args = args
        self.adv_dir = adv_dir
        self.cache_dir = cache_dir
        self.rows: list[Row] = []
        #: every eager speedup of a problem's correct baseline (first judging and interleaved)
        self.baseline_speedups: dict[str, list[float]] = {}

    def config(self, device: str) -> JudgeConfig:
        return JudgeConfig(
            device=device,
            cache_dir=self.cache_dir,
            run_timeout_s=self.args.run_timeout,
            build_timeout_s=self.args.build_timeout,
            timing_config=TimingConfig(max_time_s=1.0),
            baselines=("eager", "compile") if self.args.compile_baseline else ("eager",),
        )

    def evaluate(self, judge: Judge, case: Case) -> tuple[Any, str]:
        """(verdict or None, error text)."""
        try:
            return judge.evaluate(case.path), ""
        except Exception as exc:  # noqa: BLE001 - the point is to see what escapes
            return None, f"{type(exc).__name__}: {exc}".splitlines()[0][
                :300
            ] + "\n" + traceback.format_exc(limit=4)

    def run_problem(
        self,
        spec: str,
        device: str,
        cases: list[Case],
        baseline: Case | None,
        all_baselines: list[Case],
    ) -> None:
        run = ProblemRun(self, spec, device, baseline, all_baselines)
        try:
            if run.baseline_row is not None:
                self.print_row(run.baseline_row)
            for case in cases:
                self.print_row(run.judge(case))
        finally:
            run.close()

    def judge_one(
        self, judge: Judge, case: Case, base_speedup: float | None, judges: list[Judge | None]
    ) -> tuple[Row, Any]:
        marks_at = mark_files(self.adv_dir, judge, case)
        clear_marks(marks_at)
        since_ticks = boot_ticks()
        t0 = time.monotonic()
        verdict, error = self.evaluate(judge, case)
        seconds = time.monotonic() - t0
        resume_references(judge)
        notes: list[str] = []
        row = make_row(case, verdict, error, seconds, base_speedup)
        marks = read_marks(marks_at)
        for m in marks:
            if "breach" in m:
                notes.append("breach: " + str(m["breach"]))
                if case.breach_fails and row.outcome == "OK":
                    row.outcome = "FOOLED"
            for f in m.get("host_files", []):
                # A file the candidate wrote that the host sees after its verdict (and not
                # only a private copy of that folder in the worker's mount namespace).
                if os.path.lexists(f):
                    notes.append(f"breach: {f} is on the host after judging")
                    if case.breach_fails and row.outcome == "OK":
                        row.outcome = "FOOLED"
                    with contextlib.suppress(OSError):
                        os.unlink(f)
            for k, v in m.items():
                if k not in ("breach", "pids", "files", "host_files"):
                    notes.append(f"{k}: {v}")
        stray = stray_processes(self.adv_dir, judges)
        marked = [p for m in marks for p in m.get("pids", [])]
        alive_marked = marked_alive(marked, since_ticks, judges)
        leftovers = sorted({p for p, _ in stray} | set(alive_marked))
        if leftovers:
            desc = {p: c for p, c in stray}
            notes.append(
                "left running after judging: "
                + ", ".join(f"{p} ({desc.get(p, '?')})" for p in leftovers)
            )
            kill_pids(leftovers)
            if row.outcome == "OK":
                row.outcome = "LEAK"
        for m in marks:
            for f in m.get("files", []):
                if os.path.exists(f) and str(f).startswith(str(self.adv_dir)):
                    os.unlink(f)
        row.notes += notes
        return row, verdict

    def check_baseline(
        self, judge: Judge, baseline: Case, row: Row, judges: list[Judge | None]
    ) -> None:
        verdict, error = self.evaluate(judge, baseline)
        resume_references(judge)
        if verdict is None:
            row.notes.append("the baseline judged next raised: " + error.splitlines()[0])
            row.outcome = "BROKE"
        elif verdict.status.value != "correct":
            row.notes.append(
                f"the baseline judged next got {verdict.status.value}: {verdict.reason[:160]}"
            )
            row.outcome = "BROKE"
        else:
            row.notes.append("baseline judged next: correct")
            sp = eager_speedup(verdict)
            if sp is not None:
                self.baseline_speedups.setdefault(baseline.problem, []).append(sp)
            self.add_replay_speedup(baseline.problem, verdict)
        stray = stray_processes(self.adv_dir, judges)
        if stray:
            kill_pids([p for p, _ in stray])

    def finalize(self) -> None:
        """Apply `speedup_max_vs_baseline` against the median of the baseline's speedups (with
        --interleave the baseline is judged many times, so one noisy timing does not decide)."""
        for row in self.rows:
            apply_speedup_rule(
                row,
                self.baseline_speedups.get(row.problem, []),
                self.baseline_speedups.get(graph_key(row.problem), []),
            )

    def add_replay_speedup(self, problem: str, verdict: Any) -> None:
        """Keep the baseline's replay speedup, where its verdict has one."""
        sp = replay_speedup(verdict) if verdict is not None else None
        if sp is not None:
            self.baseline_speedups.setdefault(graph_key(problem), []).append(sp)

    @staticmethod
    def print_row(row: Row) -> None:
        sp = f" speedup={row.speedup:.3g}x" if row.speedup is not None else ""
        head = f"  [{row.outcome:6}] {row.file}: expected {row.expected}, got {row.got}"
        print(f"{head} ({row.seconds:.1f} s){sp}", flush=True)
        if row.reason:
            print(f"           reason: {row.reason[:200]}", flush=True)
        for n in row.notes:
            print(f"           note: {n[:220]}", flush=True)


class ProblemRun:
    """Judging candidates of one problem on one Judge, as the suite does: the problem's correct
    baseline first (its row is ``baseline_row``), then one candidate per :meth:`judge` call.

    Every row also goes to ``suite.rows``. A candidate marked ``fresh_judge`` gets a Judge of its
    own; after one marked ``affects_others`` or ``fresh_judge`` (after every one with
    ``--interleave``) the baseline is judged again and must stay ``correct``; a judge left
    unusable (a ``BROKE`` row) is replaced by a fresh one.
    """

    def __init__(
        self,
        suite: Suite,
        spec: str,
        device: str,
        baseline: Case | None,
        all_baselines: list[Case],
    ) -> None:
        self.suite, self.spec, self.device = suite, spec, device
        self.baseline, self.all_baselines = baseline, all_baselines
        self.judge_: Judge | None = Judge(spec, suite.config(device))
        self.base_speedup: float | None = None
        self.baseline_row: Row | None = None
        if baseline is not None:
            row, verdict = suite.judge_one(self.judge_, baseline, None, [self.judge_])
            self.base_speedup = eager_speedup(verdict) if verdict is not None else None
            if self.base_speedup is not None:
                suite.baseline_speedups.setdefault(baseline.problem, []).append(self.base_speedup)
            suite.add_replay_speedup(baseline.problem, verdict)
            suite.rows.append(row)
            self.baseline_row = row

    def judge(self, case: Case) -> Row:
        """Judge ``case`` (and the baseline after it where asked); its row, speedup rule not
        yet applied (see :func:`apply_speedup_rule`)."""
        suite, judge, baseline = self.suite, self.judge_, self.baseline
        assert judge is not None, "the run was closed"
        own = Judge(self.spec, suite.config(self.device)) if case.fresh_judge else None
        active = own or judge
        try:
            row, _ = suite.judge_one(active, case, self.base_speedup, [judge, own])
            if baseline is not None and (
                suite.args.interleave or case.affects_others or case.fresh_judge
            ):
                suite.check_baseline(active, baseline, row, [judge, own])
                notes = heal_cache(active, self.all_baselines)
                if notes:
                    row.notes += notes
                    row.outcome = "BROKE" if row.outcome == "OK" else row.outcome
        finally:
            if own is not None:
                own.close()
        if row.outcome == "BROKE" and own is None:
            # The judge may be unusable now (a dead reference is never replaced):
            # go on with a fresh one so that later rows mean something.
            judge.close()
            self.judge_ = Judge(self.spec, suite.config(self.device))
        suite.rows.append(row)
        return row

    def close(self) -> None:
        if self.judge_ is not None:
            self.judge_.close()
            self.judge_ = None


def apply_speedup_rule(
    row: Row, base_speedups: list[float], base_graph_speedups: list[float] | None = None
) -> None:
    """A `correct` timing cheat whose eager speedup exceeds ``speedup_max_vs_baseline`` times
    the median of ``base_speedups`` (the honest baseline's speedups), or whose graph-replay
    speedup exceeds it times the median of ``base_graph_speedups`` (the baseline's replay
    speedups), becomes ``FOOLED``."""
    if row.speedup_max is None or row.got != "correct":
        return
    pairs = [("speedup", row.speedup, base_speedups)]
    pairs.append(("graph replay speedup", row.graph_speedup, base_graph_speedups or []))
    for label, got, base in pairs:
        if got is None or not base:
            continue
        med = sorted(base)[len(base) // 2]
        if label == "speedup":
            row.baseline_speedup = med
        if got > row.speedup_max * med:
            row.notes.insert(
                0,
                f"{label} {got:.3g}x vs the honest baseline's median {med:.3g}x "
                f"({len(base)} judgings)",
            )
            if row.outcome in ("OK", "LEAK"):
                row.outcome = "FOOLED"


def why(r: Row) -> str:
    """The reason column: the verdict's reason, or (for a failed row) what gave it away."""
    if r.outcome != "OK" and r.notes:
        return "; ".join(r.notes)
    return r.reason or "; ".join(r.notes)


def print_table(rows: list[Row]) -> None:
    cols = [
        ("file", 40),
        ("kind", 48),
        ("expected", 22),
        ("got", 14),
        ("reason", 60),
        ("outcome", 7),
    ]
    line = "  ".join(name.ljust(w) for name, w in cols)
    print("\n" + line)
    print("-" * len(line))
    for r in rows:
        vals = [
            r.file,
            r.kind,
            r.expected,
            r.got,
            why(r).replace("\n", " "),
            r.outcome,
        ]
        print("  ".join(str(v)[:w].ljust(w) for v, (_, w) in zip(vals, cols)))
    bad = [r for r in rows if r.outcome != "OK"]
    print(
        f"\n{len(rows) - len(bad)}/{len(rows)} as expected; "
        + ", ".join(
            f"{k}: {sum(r.outcome == k for r in rows)}"
            for k in ("FOOLED", "WRONG", "BROKE", "LEAK")
            if any(r.outcome == k for r in rows)
        )
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="also judge gpu/ (needs a CUDA GPU)")
    ap.add_argument("--no-cpu", action="store_true", help="skip cpu/")
    ap.add_argument(
        "--interleave", action="store_true", help="judge the correct baseline after every candidate"
    )
    ap.add_argument("--json", type=Path, help="write every row (with its verdict) as JSON here")
    ap.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="only candidates whose file name contains one of these",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        help="build cache (default: a temporary folder, removed at the end)",
    )
    ap.add_argument(
        "--run-timeout", type=float, default=10.0, help="JudgeConfig.run_timeout_s (default 10)"
    )
    ap.add_argument(
        "--build-timeout",
        type=float,
        default=300.0,
        help="JudgeConfig.build_timeout_s (default 300)",
    )
    ap.add_argument(
        "--compile-baseline", action="store_true", help="also time torch.compile (slow on CPU)"
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="judge every selected candidate N times (default 1)"
    )
    ap.add_argument(
        "--load",
        action="store_true",
        help="while judging, load the machine (tests/load/loadgen.py: 2 x cores busy loops and "
        "a memory-bandwidth hog)",
    )
    return ap


def load_cases(dirs: list[Path]) -> list[Case]:
    """Every candidate of ``dirs`` (baselines included), sorted by file name in each folder."""
    return [parse_case(p) for d in dirs for p in sorted(d.glob("*.py"))]


@contextlib.contextmanager
def suite_environment() -> Iterator[Path]:
    """Point KJ_ADV_DIR at a fresh private folder (yielded), set KJ_ADV_ROOT and a fresh
    KJ_ADV_CANARY; on exit remove the folder and restore the three variables."""
    adv_dir = Path(tempfile.mkdtemp(prefix="kj_adv_"))
    names = ("KJ_ADV_DIR", "KJ_ADV_ROOT", "KJ_ADV_CANARY")
    saved = {k: os.environ.get(k) for k in names}
    os.environ["KJ_ADV_DIR"] = str(adv_dir)
    os.environ["KJ_ADV_ROOT"] = str(HERE)
    os.environ["KJ_ADV_CANARY"] = secrets.token_hex(16)
    try:
        yield adv_dir
    finally:
        shutil.rmtree(adv_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def machine_load(on: bool) -> contextlib.AbstractContextManager[Any]:
    """tests/load/loadgen.py's :class:`Load` (for at most two hours) when ``on``."""
    if not on:
        return contextlib.nullcontext()
    sys.path.insert(0, str(HERE.parent / "load"))
    from loadgen import Load

    load = Load(7200.0)
    print(f"load: {load.spinners} busy loops, hog {load.hog_bytes >> 20} MiB x 2", flush=True)
    return load


def run_round(suite: Suite, selected: list[Case], all_baselines: list[Case]) -> None:
    """Judge ``selected`` once, problem by problem, each after its baseline."""
    by_problem: dict[str, list[Case]] = {}
    for c in selected:
        by_problem.setdefault(c.problem, []).append(c)
    for problem, group in by_problem.items():
        gpu = group[0].path.parent.name == "gpu"
        device = "cuda" if gpu else "cpu"
        baseline = next((b for b in all_baselines if b.problem == problem), None)
        base_name = baseline.path.name if baseline else "none"
        print(f"\n== {problem} on {device} ({len(group)} candidates; baseline {base_name})")
        suite.run_problem(problem_spec(group[0]), device, group, baseline, all_baselines)


def print_repeats(rounds: list[list[Row]]) -> None:
    """Per file: in how many rounds it was OK, and the other outcomes with their counts."""
    print(f"\nacross {len(rounds)} rounds:")
    files = list(dict.fromkeys(r.file for rows in rounds for r in rows))
    for f in files:
        outs = [r for rows in rounds for r in rows if r.file == f]
        ok = sum(r.outcome == "OK" for r in outs)
        bad = sorted({f"{r.outcome} ({r.got})" for r in outs if r.outcome != "OK"})
        tail = f"  not OK: {', '.join(bad)}" if bad else ""
        print(f"  {ok:3}/{len(outs)} OK  {f}{tail}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dirs = ([] if args.no_cpu else [HERE / "cpu"]) + ([HERE / "gpu"] if args.gpu else [])
    cases = load_cases(dirs)
    if not cases or args.repeat < 1:
        print("no candidates selected" if not cases else "--repeat must be >= 1", file=sys.stderr)
        return 2
    all_baselines = [c for c in cases if c.is_baseline]
    selected = [
        c
        for c in cases
        if not c.is_baseline and (not args.only or any(s in c.path.name for s in args.only))
    ]
    own_cache = args.cache_dir is None
    cache_dir = (
        Path(tempfile.mkdtemp(prefix="kj_adv_cache_")) if own_cache else args.cache_dir.resolve()
    )
    started = time.monotonic()
    import kerneljudge

    print(f"judging with {Path(kerneljudge.__file__).parent}", flush=True)
    rounds: list[list[Row]] = []
    try:
        with machine_load(args.load), suite_environment() as adv_dir:
            for n in range(args.repeat):
                if args.repeat > 1:
                    print(f"\n######## round {n + 1} of {args.repeat}", flush=True)
                suite = Suite(args, adv_dir, cache_dir)
                run_round(suite, selected, all_baselines)
                suite.finalize()
                rounds.append(suite.rows)
    finally:
        if own_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)
    for rows in rounds:
        print_table(rows)
    if len(rounds) > 1:
        print_repeats(rounds)
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        flat = [dict(r.__dict__, round=n) for n, rows in enumerate(rounds) for r in rows]
        args.json.write_text(json.dumps(flat, indent=1, default=str))
    return 0 if all(r.outcome == "OK" for rows in rounds for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
