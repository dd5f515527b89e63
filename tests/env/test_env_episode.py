"""Episodes that run candidates (torch backend, CPU), on one shared judge."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge.env import EnvConfig, KernelEnv, ToolCall
from kerneljudge.errors import WorkerError
from kerneljudge.judge import Judge
from kerneljudge.verdict import Status, Verdict

CANDIDATES = Path(__file__).resolve().parent / "candidates"


SYNTAX_ERROR = (CANDIDATES / "torch_syntax_error.txt").read_text()


def code(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


def call(tool: str, name: str) -> ToolCall:
    return ToolCall(tool, {"kernel_code": code(name)})


def test_correctness_fail_pass_benchmark_and_submit(
    fast_config: EnvConfig, cpu_judge: Judge
) -> None:
    with KernelEnv("causal_gqa", fast_config, judge=cpu_judge) as env:
        env.reset()
        wrong = env.step(call("run_correctness", "torch_wrong"))
        assert wrong.observation.startswith("run_correctness FAILED: (0 / 5) trials matched")
        first = "First mismatching elements (trial 0): index (0, 0, 0, 0): expected"
        assert first in wrong.observation
        assert wrong.info.verdict is not None and wrong.info.verdict.status is Status.INCORRECT
        assert env.state.last_passing_code is None

        ok = env.step(call("run_correctness", "torch_ok"))
        assert ok.observation.startswith(
            "run_correctness PASSED: (5 / 5) trials all matched the reference. Numerical "
            "precision: max_abs_err="
        )
        assert ok.observation.rstrip().endswith("[Budget: 28 of 30 tool calls left.]")
        assert env.state.last_passing_code == code("torch_ok")

        bench = env.step(call("run_benchmark", "torch_ok"))
        lines = bench.observation.splitlines()
        assert lines[0].startswith("run_benchmark: correct (1 / 1 trials). Timing on ")
        assert any(ln.strip().startswith("your kernel") for ln in lines)
        assert any(ln.startswith("Speedup over PyTorch eager: ") and "95% CI" in ln for ln in lines)
        assert "Profile of ModelNew.forward (CPU operators" in bench.observation
        assert "ModelNew.forward  (yours)" in bench.observation
        rows = bench.info.profile
        assert rows and abs(sum(r["share"] for r in rows) - 1.0) < 0.05
        assert {"name", "device_time_ms", "calls", "share"} <= set(rows[0])

        final = env.step(call("submit_kernel", "torch_ok"))
        assert final.done and final.info.submitted_by == "model"
        verdict = final.info.verdict
        assert verdict is not None and verdict.status is Status.CORRECT
        assert {t.shape_set for t in verdict.check.trials} == {"public", "heldout_a", "heldout_b"}
        assert final.reward == pytest.approx(fast_config_reward(verdict))
        assert "submit_kernel: CORRECT: (3 / 3) trials over 3 shape sets" in final.observation
        assert f"Final reward: {final.reward:.3g}" in final.observation
        assert env.state.stop_reason == "submitted"
        assert Verdict.from_dict(env.state.verdict).status is Status.CORRECT


def fast_config_reward(verdict: Verdict) -> float:
    from kerneljudge.env import default_reward

    return default_reward(verdict)


def test_runtime_error_is_an_observation(fast_config: EnvConfig, cpu_judge: Judge) -> None:
    with KernelEnv("causal_gqa", fast_config, judge=cpu_judge) as env:
        env.reset()
        r = env.step(call("run_correctness", "torch_raises"))
        assert r.observation.startswith("run_correctness FAILED: runtime error: IndexError")
        assert "line 12" in r.observation  # the candidate's own line
        assert len(r.observation.splitlines()) < 20 and not r.done


def test_budget_runs_out_and_the_last_passing_kernel_is_submitted(
    fast_config: EnvConfig, cpu_judge: Judge
) -> None:
    seen: list[Verdict | None] = []

    def reward(verdict: Verdict | None) -> float:
        seen.append(verdict)
        return 7.0 if verdict is not None and verdict.correct else -1.0

    config = fast_config.replace(max_tool_calls=3, submit_shape_sets=("public",))
    with KernelEnv("causal_gqa", config, judge=cpu_judge, reward=reward) as env:
        env.reset()
        env.step(call("run_correctness", "torch_ok"))
        second = env.step(call("run_correctness", "torch_wrong"))
        assert "This is your last tool call" in second.observation
        last = env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        assert last.done and last.reward == 7.0
        assert last.info.submitted_by == "budget"
        assert last.info.stop_reason == "tool_calls_exhausted"
        assert last.info.verdict is not None and last.info.verdict.correct
        said = "the last kernel that passed run_correctness was submitted for you"
        assert said in last.observation
        assert "submit_kernel: CORRECT" in last.observation
        assert len(seen) == 1


def test_profiler_failure_is_a_note(
    fast_config: EnvConfig, cpu_judge: Judge, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kw: object) -> list[dict[str, object]]:
        raise WorkerError("worker failed on profile: CUPTI is not available")

    monkeypatch.setattr(cpu_judge, "profile", broken)
    with KernelEnv("causal_gqa", fast_config, judge=cpu_judge) as env:
        env.reset()
        r = env.step(call("run_benchmark", "torch_ok"))
        note = "Profile: not available (worker failed on profile: CUPTI is not available)."
        assert note in r.observation
        assert r.info.verdict is not None and r.info.verdict.correct


@pytest.mark.slow
@pytest.mark.gpu
def test_benchmark_profiles_the_candidates_own_gpu_kernels(tmp_path: Path) -> None:
    kernel = Path(__file__).resolve().parents[2] / "examples" / "causal_gqa" / "cuda_fused.py"
    config = EnvConfig(device="cuda", cache_dir=str(tmp_path), benchmark_time_s=1.0)
    with KernelEnv("causal_gqa", config) as env:
        task = env.reset()
        assert "SMs" in task.prompt and "Datasheet peaks" in task.prompt
        r = env.step(ToolCall("run_benchmark", {"kernel_code": kernel.read_text()}))
        assert r.info.verdict is not None and r.info.verdict.correct, r.observation
        assert "Speedup over torch.compile" in r.observation
        assert "GPU kernels" in r.observation and "(yours)" in r.observation, r.observation
        assert r.info.profile and any(row["own"] for row in r.info.profile)
