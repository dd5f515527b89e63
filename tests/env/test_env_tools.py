"""Tools, schemas, prompts, observations, budget, rewards and state: no candidate runs here."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Literal

import pytest

from kerneljudge.env import (
    TOOL_NAMES,
    CallRecord,
    EnvConfig,
    EpisodeOver,
    EpisodeState,
    KernelEnv,
    Observation,
    SpeedupReward,
    ToolCall,
    ToolError,
    default_reward,
    prompts,
    tool,
)
from kerneljudge.env import observations as obs
from kerneljudge.env._tool import parse_docstring
from kerneljudge.problem import Problem
from kerneljudge.verdict import (
    BuildResult,
    CheckResult,
    CompilerMessage,
    DeviceInfo,
    Measurement,
    Mismatch,
    Speedup,
    Status,
    TimingResult,
    TrialResult,
    Verdict,
)

CANDIDATES = Path(__file__).resolve().parent / "candidates"
SYNTAX_ERROR = (CANDIDATES / "torch_syntax_error.txt").read_text()


# ---------------------------------------------------------------------------- tool machinery
def test_tool_schema_comes_from_signature_and_docstring() -> None:
    def shout(text: str, times: int = 2, mode: Literal["a", "b"] = "a") -> str:
        """Repeat some text loudly.

        More detail for the model.

        Args:
            text: what to repeat.
            times: how often,
                at least once.
            mode: a or b.

        Returns:
            The text.
        """
        return text.upper() * times

    t = tool(shout)
    fn = t.schema()["function"]
    assert fn["name"] == "shout"
    assert fn["description"].startswith("Repeat some text loudly.\n\nMore detail for the model.")
    assert "Args:" not in fn["description"] and "Returns:" in fn["description"]
    params = fn["parameters"]
    assert params["required"] == ["text"]
    assert params["additionalProperties"] is False
    assert params["properties"]["text"] == {"type": "string", "description": "what to repeat."}
    assert params["properties"]["times"] == {
        "type": "integer",
        "description": "how often, at least once.",
        "default": 2,
    }
    assert params["properties"]["mode"]["enum"] == ["a", "b"]
    assert t('{"text": "hi", "times": 3}') == "HIHIHI"
    assert t({"text": "x"}) == "XX"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"text": "hi"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "missing required argument 'text'"),
        ('{"text": "a", "loud": true}', "unknown argument 'loud'"),
        ('{"text": 5}', "argument 'text' must be string"),
        ('{"text": "a", "times": 1.5}', "argument 'times' must be integer"),
    ],
)
def test_tool_rejects_bad_arguments_with_a_tool_error(arguments: str, message: str) -> None:
    def echo(text: str, times: int = 1) -> str:
        """Echo.

        Args:
            text: the text.
            times: repeats.
        """
        return text * times

    with pytest.raises(ToolError, match=re.escape(message)):
        tool(echo)(arguments)


def test_tool_refuses_undocumented_or_untyped_parameters() -> None:
    def undocumented(code: str) -> str:
        """No Args section."""
        return code

    def untyped(code) -> str:  # type: ignore[no-untyped-def]
        """Untyped.

        Args:
            code: the code.
        """
        return code

    with pytest.raises(TypeError, match="no Args: entry"):
        tool(undocumented)
    with pytest.raises(TypeError, match="no type annotation"):
        tool(untyped)


def test_parse_docstring_keeps_description_and_joins_continuations() -> None:
    doc = "Line one.\n\nArgs:\n    a: first\n        more.\n    b (int): second."
    desc, args = parse_docstring(doc)
    assert desc == "Line one."
    assert args == {"a": "first more.", "b": "second."}


# ---------------------------------------------------------------------------- environment
def test_default_tools_and_schemas(fast_config: EnvConfig) -> None:
    with KernelEnv("causal_gqa", fast_config) as env:
        task = env.reset()
        names = [t["function"]["name"] for t in task.tools]
        assert names == list(TOOL_NAMES)
        for schema in task.tools:
            params = schema["function"]["parameters"]
            assert params["required"] == ["kernel_code"]
            assert schema["function"]["description"]
        submit = task.tools[-1]["function"]["description"]
        assert "This ends the episode" in submit
        assert [m["role"] for m in task.messages] == ["system", "user"]


def test_prompt_states_reference_rules_device_tools_and_budget(fast_config: EnvConfig) -> None:
    with KernelEnv("causal_gqa", fast_config.replace(max_tool_calls=12)) as env:
        prompt = env.reset().prompt
    assert "class Model(nn.Module)" in prompt and "def get_inputs" in prompt
    assert "SHAPE_SETS" not in prompt and "heldout" not in prompt and "seq_len = 80" in prompt
    assert "ModelNew" in prompt
    assert "fp32 uses atol=rtol=1e-4" in prompt
    assert "float64" in prompt
    assert "2 held-out shape sets" in prompt
    assert "Device: the CPU" in prompt and "hardware threads" in prompt
    for name in TOOL_NAMES:
        assert f"- {name}(kernel_code):" in prompt
    assert "12 tool calls" in prompt
    assert "the last kernel that passed run_correctness is submitted" in prompt


def test_gpu_device_text_names_sms_memory_and_peaks() -> None:
    info = DeviceInfo(
        kind="cuda",
        name="NVIDIA H200",
        capability="9.0",
        sm_count=132,
        memory_bytes=150_000_000_000,
        l2_bytes=50 * 2**20,
    )
    text = prompts.describe_device_text(info, ("eager", "compile"))
    assert "NVIDIA H200 (compute capability 9.0)" in text
    assert "132 SMs" in text and "140 GiB memory" in text
    assert "peak memory bandwidth 4.80 TB/s" in text and "FP32 67 TFLOP/s" in text
    assert "PyTorch eager and torch.compile" in text
    unknown = DeviceInfo(kind="cuda", name="Some Future GPU", sm_count=10, memory_bytes=2**34)
    assert "peak" not in prompts.describe_device_text(unknown, ("eager",))


def test_prompt_templates_are_replaceable(fast_config: EnvConfig, tmp_path: Path) -> None:
    (tmp_path / "task.md").write_text(
        "<!-- my template -->\nSolve $problem_name in $dtype within ${max_tool_calls} calls; $$5."
    )
    with KernelEnv("causal_gqa", fast_config.replace(prompt_dir=str(tmp_path))) as env:
        task = env.reset()
        assert task.prompt == "Solve causal_gqa in fp32 within 30 calls; $5."
        assert "expert" in task.system  # not replaced: the bundled one
    (tmp_path / "task.md").write_text("Hello $nobody")
    with KernelEnv("causal_gqa", fast_config.replace(prompt_dir=str(tmp_path))) as env:
        with pytest.raises(ValueError, match=r"unknown variable \$nobody"):
            env.reset()


def test_a_prompt_dir_that_is_no_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="prompt folder .*nodir does not exist"):
        prompts.load_template("task.md", tmp_path / "nodir")
    (tmp_path / "file.md").write_text("x")
    with pytest.raises(NotADirectoryError, match="prompt folder .*file.md is not a folder"):
        prompts.load_template("task.md", tmp_path / "file.md")
    # a folder without the file: the bundled template
    assert prompts.load_template("task.md", tmp_path) == prompts.load_template("task.md")


def test_tool_errors_are_observations_and_count(fast_config: EnvConfig) -> None:
    with KernelEnv("causal_gqa", fast_config.replace(max_tool_calls=5)) as env:
        env.reset()
        r = env.step(ToolCall("compile_kernel", '{"kernel_code": "x'))
        assert r.observation.startswith("compile_kernel ERROR: the arguments are not valid JSON")
        assert r.info.outcome == "tool_error" and not r.done
        r = env.step({"function": {"name": "compile_kernel", "arguments": '{"kernel_code": ""}'}})
        assert "kernel_code is empty" in r.observation
        r = env.step(ToolCall("make_it_fast", {}))
        assert r.observation.startswith("ERROR: there is no tool 'make_it_fast'")
        assert "[Budget: 2 of 5 tool calls left.]" in r.observation
        # a cuda candidate on a CPU environment: refused before any build
        r = env.step(
            ToolCall(
                "run_correctness",
                {
                    "kernel_code": "from torch.utils.cpp_extension import load_inline\n"
                    "x = load_inline(name='a', cpp_sources='', "
                    "cuda_sources='__global__ void k(){}')\n"
                    "class ModelNew: pass\n"
                },
            )
        )
        assert "needs a CUDA GPU" in r.observation and r.info.outcome == "tool_error"
        assert [h.outcome for h in env.state.history] == ["tool_error"] * 4
        # the step carries the tool's one frozen observation; the refused code was read
        result = r.info.result
        assert isinstance(result, Observation) and result.tool == "run_correctness"
        assert r.observation.startswith(result.text) and result.error == r.info.error
        assert result.code is not None and env.state.last_code == result.code
        assert env.state.history[-1].code_sha256 and not env.state.history[1].code_sha256
        assert result.verdict is None and not result.passed and not result.submitted
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.text = "changed"  # type: ignore[misc]
        assert "result" not in r.info.to_dict()
        assert json.loads(json.dumps(result.to_dict()))["outcome"] == "tool_error"


def test_compile_error_is_mapped_to_a_line_and_budget_runs_out(fast_config: EnvConfig) -> None:
    config = fast_config.replace(max_tool_calls=2, on_exhausted="submit_last_passing")
    with KernelEnv("causal_gqa", config) as env:
        env.reset()
        first = env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        head = "compile_kernel FAILED: compilation failed with 1 error"
        assert first.observation.startswith(head)
        assert "kernel_code:10" in first.observation
        assert "This is your last tool call" in first.observation
        assert first.info.build is not None and not first.info.build.ok
        last = env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        assert last.done and last.reward == 0.0
        assert "The budget is exhausted (no tool calls left)" in last.observation
        assert "no kernel passed run_correctness" in last.observation
        assert last.observation.rstrip().endswith("[Budget: 0 of 2 tool calls left.]")
        assert env.state.stop_reason == "tool_calls_exhausted" and env.final_verdict is None
        with pytest.raises(EpisodeOver):
            env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))


def test_turn_budget_notice_and_exhaustion(fast_config: EnvConfig) -> None:
    with KernelEnv("causal_gqa", fast_config.replace(max_turns=2, on_exhausted="fail")) as env:
        env.reset()
        env.begin_turn()
        r = env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        assert "Your next reply is your last turn" in r.observation
        assert env.end_turn() is None
        env.begin_turn()
        nudge = env.nudge()
        assert "You did not call a tool" in nudge
        assert nudge.endswith("[Budget: 29 of 30 tool calls left, 0 replies left.]")
        final = env.end_turn()
        assert final is not None and final.done and final.reward == 0.0
        assert "no replies left" in final.observation and "counts as failed" in final.observation
        assert env.state.stop_reason == "turns_exhausted"


def test_state_round_trips_and_continues_elsewhere(fast_config: EnvConfig) -> None:
    with KernelEnv("causal_gqa", fast_config.replace(max_tool_calls=3)) as env:
        env.reset(episode_id="ep-1")
        env.begin_turn()
        env.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        text = env.state.to_json()
    state = EpisodeState.from_json(text)
    assert state.episode_id == "ep-1" and state.calls_used == 1 and state.turns_used == 1
    assert state.history == [
        CallRecord(
            1,
            1,
            "compile_kernel",
            "compile_error",
            state.history[0].code_sha256,
            state.history[0].duration_s,
        )
    ]
    assert json.loads(text)["state_version"] == "1.0"
    with KernelEnv.from_state(text) as env2:
        r = env2.step(ToolCall("compile_kernel", {"kernel_code": SYNTAX_ERROR}))
        assert "[Budget: 1 of 3 tool calls left." in r.observation
        assert env2.state.episode_id == "ep-1"
    bad = dict(json.loads(text), state_version="2.0")
    with pytest.raises(ValueError, match="newer"):
        EpisodeState.from_dict(bad)


def test_env_config_validates_and_round_trips() -> None:
    cfg = EnvConfig(baselines=("eager",), submit_shape_sets=("public", "heldout_a"))
    assert EnvConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="on_exhausted"):
        EnvConfig(on_exhausted="retry")
    with pytest.raises(ValueError, match="baselines"):
        EnvConfig(baselines=("jax",))
    bad: list[dict[str, Any]] = [
        {"benchmark_time_s": -1},
        {"benchmark_time_s": 0},
        {"submit_time_s": 0},
        {"submit_time_s": float("nan")},
        {"profile_calls": 0},
        {"submit_trials": 0},
        {"max_turns": 0},
        {"submit_shape_sets": ()},
    ]
    for fields in bad:
        (name,) = fields
        with pytest.raises(ValueError, match=f"^{name} must be"):
            EnvConfig(**fields)


# ---------------------------------------------------------------------------- observations
def _verdict(status: Status, **kw: object) -> Verdict:
    return Verdict(
        status=status,
        reason=str(kw.pop("reason", "")),
        problem="p",
        candidate_sha256="0",
        backend="torch",
        device=DeviceInfo(kind="cpu", name="cpu"),
        **kw,
    )  # type: ignore[arg-type]


def _trial(i: int, passed: bool, err: float, **kw: object) -> TrialResult:
    return TrialResult(
        index=i,
        passed=passed,
        max_abs_err=err,
        mean_abs_err=err / 10,
        max_rel_err=err * 100,
        allclose=passed,
        **kw,
    )  # type: ignore[arg-type]


def test_correctness_observation_reads_like_the_example_transcripts() -> None:
    check = CheckResult(
        True, tuple(_trial(i, True, 1.22e-4 * (i + 1) / 5) for i in range(5)), "oracle", 1e-4, 1e-4
    )
    text = obs.check_text("run_correctness", _verdict(Status.CORRECT, check=check))
    assert re.fullmatch(
        r"run_correctness PASSED: \(5 / 5\) trials all matched the reference\. Numerical "
        r"precision: max_abs_err=1\.22e-04 mean_abs_err=\d\.\d\de-\d\d max_rel_err=1\.22e-02",
        text,
    )


def test_incorrect_observation_lists_first_mismatches() -> None:
    bad = _trial(
        1,
        False,
        0.5,
        reason="output not allclose(atol=0.0001, rtol=0.0001)",
        mismatches=(Mismatch((0, 3), 1.0, 1.5), Mismatch((0, 4), -2.0, 0.25)),
    )
    check = CheckResult(False, (_trial(0, True, 1e-6), bad), "allclose", 1e-4, 1e-4)
    text = obs.check_text("run_correctness", _verdict(Status.INCORRECT, check=check, reason="x"))
    head = "run_correctness FAILED: (1 / 2) trials matched the reference. Trial 1:"
    assert text.startswith(head)
    assert "index (0, 3): expected 1, got 1.5; index (0, 4): expected -2, got 0.25" in text


def test_runtime_error_observation_is_a_few_lines() -> None:
    log = "\n".join(
        ["RuntimeError: CUDA error: an illegal memory access was encountered"]
        + [f"  frame {i}" for i in range(40)]
    )
    v = _verdict(
        Status.RUNTIME_ERROR,
        reason="RuntimeError: CUDA error: an illegal memory access was encountered",
        worker_log=log,
    )
    text = obs.check_text("run_correctness", v)
    assert text.startswith(
        "run_correctness FAILED: runtime error: RuntimeError: CUDA error: an illegal memory access"
    )
    assert len(text.splitlines()) <= 14


def test_compiler_log_is_shortened_for_the_model() -> None:
    log = (
        "kernel_code:22: error: 'num_groups' was not declared in this scope (main.cpp:15)\n"
        "  >   22 |   const int64_t group = Hq / num_groups;\n"
        "--- compiler output (last 3 lines) ---\n"
        "[1/2] c++ -MMD -MF main.o.d -c /tmp/x/builds/ab/abcd/ext/kj/main.cpp -o main.o\n"
        "/tmp/x/builds/ab/abcd/ext/kj/main.cpp:15:30: error: 'num_groups' was not declared\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    build = BuildResult(
        ok=False,
        backend="cpp",
        log=log,
        messages=(
            CompilerMessage("main.cpp", 15, 30, "error", "'num_groups' was not declared", 22),
        ),
    )
    text = obs.build_text("compile_kernel", build)
    assert "kernel_code:22: error" in text
    assert "main.cpp:15:30: error" in text and "/tmp/x" not in text and "[1/2]" not in text


def test_benchmark_observation_says_why_a_baseline_is_missing() -> None:
    m = Measurement("eager", 50, 2.0, 1.8, 2.2, 1.6, 2.0, (1.9, 2.0))
    c = Measurement("candidate", 50, 0.5, 0.45, 0.55, 0.4, 0.5, (0.48, 0.5))
    why = "not timed: compile did not finish within 600 s"
    timing = TimingResult(
        "cuda_event",
        (m, c),
        (Speedup("eager", 4.0, (3.8, 4.2)),),
        10,
        "precision",
        baseline_errors={"compile": why},
    )
    check = CheckResult(True, (_trial(0, True, 1e-6),), "oracle", 1e-4, 1e-4)
    text = obs.benchmark_text(
        "run_benchmark", _verdict(Status.CORRECT, check=check, timing=timing), ""
    )
    assert f"Speedup over torch.compile: {why}" in text


def test_benchmark_observation_has_times_interval_and_profile() -> None:
    def m(name: str, med: float) -> Measurement:
        return Measurement(name, 50, med, med * 0.9, med * 1.1, med * 0.8, med, (med * 0.95, med))

    timing = TimingResult(
        "cuda_event",
        (m("eager", 2.0), m("candidate", 0.5), m("compile", 1.0)),
        (Speedup("eager", 4.0, (3.8, 4.2)), Speedup("compile", 2.0, (1.9, 2.1))),
        10,
        "precision",
    )
    check = CheckResult(True, (_trial(0, True, 1e-6),), "oracle", 1e-4, 1e-4)
    rows = [
        {
            "name": "void causal_gqa_kernel<32>(float const*)",
            "device_time_ms": 0.45,
            "calls": 1.0,
            "share": 0.9,
            "own": True,
        },
        {"name": "Memset (Device)", "device_time_ms": 0.05, "calls": 1.0, "share": 0.1},
    ]
    profile = obs.profile_text(rows, "", "cuda", 5)
    text = obs.benchmark_text(
        "run_benchmark", _verdict(Status.CORRECT, check=check, timing=timing), profile
    )
    assert "your kernel" in text.splitlines()[1]
    assert "Speedup over PyTorch eager: 4x (95% CI 3.8x-4.2x)" in text
    assert "Speedup over torch.compile: 2x (95% CI 1.9x-2.1x)" in text
    assert "GPU kernels" in text and "90.0%" in text and "(yours)" in text
    assert obs.profile_text([], "the profiler is not available", "cuda", 5).startswith(
        "Profile: not available"
    )


# ---------------------------------------------------------------------------- rewards
def _timed(speedup: float, lo: float | None = None) -> Verdict:
    m = Measurement("candidate", 10, 1.0, 1.0, 1.0, 1.0, 1.0, (1.0, 1.0))
    speed = Speedup("eager", speedup, (lo or speedup, speedup))
    timing = TimingResult("monotonic", (m,), (speed,), 1, "max_time")
    return _verdict(Status.CORRECT, timing=timing)


def test_default_reward_is_zero_unless_correct_and_grows_with_log_speedup() -> None:
    assert default_reward(None) == 0.0
    assert default_reward(_verdict(Status.INCORRECT)) == 0.0
    assert default_reward(_verdict(Status.CORRECT)) == 0.5  # no timing
    assert default_reward(_timed(1.0)) == pytest.approx(0.5)
    assert default_reward(_timed(4.0)) == pytest.approx(0.75)
    assert default_reward(_timed(16.0)) == pytest.approx(1.0)
    assert default_reward(_timed(1000.0)) == 1.0
    assert default_reward(_timed(0.001)) == pytest.approx(0.05)
    assert default_reward(_timed(2.0)) < default_reward(_timed(3.0))
    cautious = SpeedupReward(cap=4.0, floor=0.0, use_lower_bound=True)
    assert cautious(_timed(4.0, lo=2.0)) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        SpeedupReward(cap=1.0)


def test_reward_hint_in_prompt_mentions_full_evaluation(fast_config: EnvConfig) -> None:
    problem = Problem.load("causal_gqa")
    values = prompts.task_variables(problem, DeviceInfo("cpu", "cpu", sm_count=2), fast_config, [])
    assert values["submit_trials"] == 1 and values["atol"] == "1e-4"
    assert prompts.format_tolerance(0.01) == "1e-2"
    assert prompts.format_tolerance(2.5e-3) == "2.5e-3"


# ---------------------------------------------------------------------------- backend registry
def test_backend_registry_is_the_one_source_of_backend_facts() -> None:
    from kerneljudge.build import IMPORT_ONLY_BACKENDS
    from kerneljudge.candidate import BACKENDS, GPU_BACKENDS, Candidate
    from kerneljudge.candidate.backends import REGISTRY, backend, detect_backend
    from kerneljudge.errors import CandidateError

    assert BACKENDS == ("cuda", "cpp", "triton", "torch")
    assert tuple(b.name for b in REGISTRY) == BACKENDS
    assert GPU_BACKENDS == {b.name for b in REGISTRY if b.needs_gpu} == {"cuda", "triton"}
    assert IMPORT_ONLY_BACKENDS == {b.name for b in REGISTRY if not b.compiled}
    assert IMPORT_ONLY_BACKENDS == {"torch", "triton"}
    assert [b.name for b in REGISTRY if not b.custom_kernel] == ["torch"]
    with pytest.raises(CandidateError, match="unknown backend 'rust'"):
        backend("rust")
    with pytest.raises(CandidateError, match="unknown backend 'rust'"):
        Candidate.from_source("x = 1", backend="rust")
    cuda = "from torch.utils.cpp_extension import load_inline\nload_inline('a', '', 'k')\n"
    assert detect_backend(cuda) == "cuda" and Candidate.from_source(cuda).needs_gpu
    assert detect_backend("import triton\n") == "triton"
    assert detect_backend("load_inline(name='a', cpp_sources='')") == "cpp"
    assert not Candidate.from_source("import torch\n").needs_gpu
