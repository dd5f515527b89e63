"""Stage lines while a verdict is being reached: the judge's optional progress callback."""

from __future__ import annotations

from pathlib import Path

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig

FIX = Path(__file__).parent / "fixtures"


def test_the_judge_says_each_stage_in_order(tmp_path: Path) -> None:
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path,
        trials=3,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    said: list[str] = []
    with Judge(FIX / "tiny_problem.py", config) as judge:
        assert judge.progress is None  # by default nothing is said
        judge.progress = said.append
        first = judge.evaluate(FIX / "candidates" / "good.py")
        again = judge.evaluate(FIX / "candidates" / "good.py")
        judge.progress = None
        wrong = judge.evaluate(FIX / "candidates" / "wrong.py")
    assert first.status is Status.CORRECT and again.status is Status.CORRECT, first.reason
    assert wrong.status is Status.INCORRECT
    stages = [
        "starting the candidate's worker",
        "preparing the reference",
        "loading the candidate",
        "trial 1/3",
        "trial 2/3",
        "trial 3/3",
        "timing",
    ]
    assert said == ["building good.py (torch)", *stages, "build cached", *stages]


def test_a_syntax_error_is_judged_without_a_stage(tmp_path: Path) -> None:
    syntax = tmp_path / "syntax.py"
    syntax.write_text("class ModelNew(\n")
    said: list[str] = []
    with Judge(FIX / "tiny_problem.py", JudgeConfig(device="cpu", cache_dir=tmp_path)) as judge:
        judge.progress = said.append
        assert judge.evaluate(syntax).status is Status.COMPILE_ERROR
    assert said == []
