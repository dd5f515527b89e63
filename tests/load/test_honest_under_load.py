"""Honest candidates stay `correct` on a loaded host, and timer cheats are still caught there.

While :class:`loadgen.Load` keeps the machine busy (2 x cores busy loops, a memory-bandwidth hog,
and a verdict loop of its own beside), every honest candidate below is judged several times on
one warm Judge per problem with a short timing budget. Every verdict must be `correct` (never
`rejected` as a timer cheat, never `timeout`); an identity candidate's eager speedup interval must
contain 1 unless the verdict says its host was noisy; the timer cheats of the adversarial suite
must still get an acceptable verdict (run_suite.py's rules) under the same load.

C++ candidates are built before the load starts (the build cache is shared with the other
tests); the number of real builds is printed. One line per verdict goes to the log.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.verdict import Verdict

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ADV = TESTS / "adversarial"
sys.path.insert(0, str(ADV))
sys.path.insert(0, str(HERE))

import run_suite  # noqa: E402
from loadgen import Load, load_tier_config  # noqa: E402

pytestmark = [pytest.mark.load, pytest.mark.slow]

REPO = TESTS.parent
PROBLEM_CPU = str(ADV / "problem_cpu.py")
TINY_CALL = str(TESTS / "fixtures" / "tiny_call_problem.py")
TINY = str(TESTS / "fixtures" / "tiny_problem.py")
#: Upper bound of the load's lifetime (s): it is killed at the end of the module anyway.
LOAD_SECONDS = 3600.0


@dataclass(frozen=True)
class Honest:
    """An honest candidate judged ``times`` times on ``problem``; ``identity``: it computes
    exactly the reference's ops, so its eager speedup is 1 in truth."""

    name: str
    problem: str
    path: Path
    times: int
    identity: bool = False


HONEST = [
    *(
        Honest(f"{p}/cpp_reference", p, REPO / "examples" / p / "cpp_reference.py", 2)
        for p in ("causal_gqa", "mla_kv_projection", "triangle_attention")
    ),
    Honest("correct_baseline", PROBLEM_CPU, ADV / "cpu" / "correct_baseline.py", 3, True),
    Honest("correct_baseline_cpp", PROBLEM_CPU, ADV / "cpu" / "correct_baseline_cpp.py", 3),
    Honest("correct_parallel_cpp", PROBLEM_CPU, ADV / "cpu" / "correct_parallel_cpp.py", 3),
    Honest("tiny_silu_cpp", TINY_CALL, HERE / "candidates" / "tiny_silu_cpp.py", 8),
    Honest("identity_tiny", TINY, HERE / "candidates" / "identity_tiny_linear_gate.py", 8, True),
]
COMPILED = Honest("torch_compile", PROBLEM_CPU, HERE / "candidates" / "compiled_linear_gelu.py", 1)
TIMER_CHEATS = [
    "cheat_timer_patch_torch",
    "cheat_timer_patch_worker",
    "cheat_patch_op_time",
    "cheat_precompute_between_calls",
]
#: The verdict loop that runs beside the load test's own verdicts (on a judge of its own).
BESIDE = (PROBLEM_CPU, str(ADV / "cpu" / "correct_baseline.py"))


def _flagged_noisy(verdict: Verdict) -> bool:
    """The verdict says its host was too noisy for its interval to be trusted
    (``verdict.timing.host.noisy``; False where the timing result has no such field)."""
    host = getattr(verdict.timing, "host", None)
    return bool(getattr(host, "noisy", False))


def _eager(verdict: Verdict) -> tuple[float, float, float] | None:
    """(median, ci low, ci high) of the eager speedup, or None when it was not timed."""
    s = verdict.timing.speedup("eager") if verdict.timing is not None else None
    return None if s is None else (s.median, s.ci95[0], s.ci95[1])


def _line(name: str, i: int, verdict: Verdict) -> str:
    sp = _eager(verdict)
    speed = f"eager {sp[0]:.3g}x [{sp[1]:.3g}, {sp[2]:.3g}]" if sp else "not timed"
    noisy = " noisy-host" if _flagged_noisy(verdict) else ""
    reason = f" | {verdict.reason[:220]}" if verdict.reason else ""
    stages = " ".join(f"{k} {v:.1f}" for k, v in verdict.stage_s.items())
    return (
        f"LOAD {name} #{i}: {verdict.status.value} {speed}{noisy} "
        f"({verdict.duration_s:.1f} s: {stages}){reason}"
    )


def _config(cache: Path) -> JudgeConfig:
    """One warm judge per problem: eager baseline only, a 0.3 s timing budget, two trials."""
    config: JudgeConfig = load_tier_config(cache)
    return config


class _Bench:
    """The judges (one per problem, warm workers), the load, and every verdict so far."""

    def __init__(self, cache: Path, log: list[str]) -> None:
        self.cache, self.log = cache, log
        self.judges: dict[str, Judge] = {}
        self.verdicts: dict[str, list[Verdict]] = {}
        self.load: Load | None = None

    def judge(self, problem: str) -> Judge:
        if problem not in self.judges:
            self.judges[problem] = Judge(problem, _config(self.cache))
        return self.judges[problem]

    def evaluate(self, name: str, problem: str, path: Path, times: int) -> list[Verdict]:
        out = []
        for i in range(times):
            verdict = self.judge(problem).evaluate(path)
            self.say(_line(name, i, verdict))
            out.append(verdict)
        self.verdicts.setdefault(name, []).extend(out)
        return out

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.append(line)

    def close(self) -> None:
        for judge in self.judges.values():
            judge.close()


def _build_all(bench: _Bench, paths: list[Path]) -> int:
    """Build every C++ candidate in ``paths`` (two at a time) before the load starts; the
    number of real (uncached) builds."""

    def one(path: Path) -> Any:
        return bench.judge(PROBLEM_CPU).build(path, "cpu")

    cpp = [p for p in paths if "load_inline" in p.read_text()]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, cpp))
    failed = [str(p) for p, r in zip(cpp, results) if not r.ok]
    assert not failed, f"builds failed: {failed}"
    built = sum(not r.cached for r in results)
    took = sum(r.duration_s for r in results if not r.cached)
    bench.say(f"LOAD builds: {built} of {len(cpp)} C++ candidates compiled ({took:.0f} s)")
    return built


@pytest.fixture(scope="module")
def bench(shared_cache: Path, verdict_log: list[str]) -> Iterator[_Bench]:
    paths = [h.path for h in HONEST] + [COMPILED.path]
    paths += [ADV / "cpu" / f"{c}.py" for c in TIMER_CHEATS]
    bench = _Bench(shared_cache, verdict_log)
    try:
        _build_all(bench, paths)
        with Load(LOAD_SECONDS, beside=BESIDE, beside_config=_config(shared_cache)) as load:
            bench.say(
                f"LOAD started: {load.spinners} busy loops, hog {load.hog_bytes >> 20} MiB x 2, "
                "a verdict loop beside"
            )
            bench.load = load
            yield bench
            alive = load.alive()
        assert alive == load.spinners + 1, "a load process ended before the tests did"
    finally:
        bench.close()


@pytest.mark.parametrize("case", HONEST, ids=[h.name for h in HONEST])
def test_honest_correct_under_load(bench: _Bench, case: Honest) -> None:
    verdicts = bench.evaluate(case.name, case.problem, case.path, case.times)
    bad = [f"{v.status.value}: {v.reason[:200]}" for v in verdicts if v.status.value != "correct"]
    assert not bad, f"{len(bad)} of {len(verdicts)} honest verdicts not correct: {bad}"
    if case.identity:
        missed = [
            _eager(v)
            for v in verdicts
            if not _flagged_noisy(v) and not (_eager(v)[1] <= 1.0 <= _eager(v)[2])
        ]
        assert not missed, (
            f"{len(missed)} of {len(verdicts)} identity intervals exclude 1 with no noisy-host "
            f"flag: {missed}"
        )


def test_torch_compile_correct_under_load(bench: _Bench) -> None:
    c = COMPILED
    verdicts = bench.evaluate(c.name, c.problem, c.path, c.times)
    bad = [f"{v.status.value}: {v.reason[:200]}" for v in verdicts if v.status.value != "correct"]
    assert not bad, f"{len(bad)} of {len(verdicts)} verdicts not correct: {bad}"


@pytest.mark.parametrize("name", TIMER_CHEATS)
def test_timer_cheat_caught_under_load(bench: _Bench, name: str) -> None:
    case = run_suite.parse_case(ADV / "cpu" / f"{name}.py")
    verdict = bench.evaluate(name, PROBLEM_CPU, case.path, 1)[0]
    row = run_suite.make_row(case, verdict, "", verdict.duration_s, None)
    honest = [_eager(v)[0] for v in bench.verdicts.get("correct_baseline", []) if _eager(v)]
    run_suite.apply_speedup_rule(row, honest)
    assert honest, "the honest baseline was not timed under load first"
    assert row.outcome == "OK", f"{row.outcome}: got {row.got}: {run_suite.why(row)}"


def test_beside_verdicts_correct(bench: _Bench) -> None:
    """The verdict loop beside (a judge of its own) is honest too: all `correct`, none raised."""
    assert bench.load is not None
    beside = bench.load.beside
    assert beside is not None and not beside.errors, beside.errors if beside else None
    bad = [f"{s}: {r[:200]}" for s, r in beside.verdicts if s != "correct"]
    bench.say(f"LOAD beside: {len(beside.verdicts)} verdicts, {len(bad)} not correct: {bad}")
    assert beside.verdicts, "no verdict beside finished"
    assert not bad, f"{len(bad)} of {len(beside.verdicts)} verdicts beside not correct: {bad}"
