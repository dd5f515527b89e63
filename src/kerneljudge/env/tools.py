"""The agent-facing tools: ``compile_kernel``, ``run_correctness``, ``run_benchmark``,
``submit_kernel``.

Each factory takes the episode's :class:`ToolContext` and returns a :class:`Tool`; the inner
function's docstring is the description the model reads and its signature the JSON schema. Each
inner function returns one :class:`~kerneljudge.env.observations.Observation`.
"""

from __future__ import annotations

from kerneljudge.candidate.backends import backend
from kerneljudge.env import observations as obs
from kerneljudge.env._context import ToolContext
from kerneljudge.env._tool import Tool, tool
from kerneljudge.env.observations import Observation
from kerneljudge.verdict import Status

__all__ = [
    "TOOL_NAMES",
    "compile_kernel",
    "default_tools",
    "run_benchmark",
    "run_correctness",
    "submit_kernel",
]

#: The default tools, in the order the prompt lists them.
TOOL_NAMES = ("compile_kernel", "run_correctness", "run_benchmark", "submit_kernel")


def compile_kernel(ctx: ToolContext) -> Tool[Observation]:
    """The ``compile_kernel`` tool: build only."""

    def compile_kernel(kernel_code: str) -> Observation:
        """Compile your candidate without running it.

        Builds the extension your code defines (load_inline) in a clean process, the way the
        judge does. Returns success with the build time, or the compiler errors with line
        numbers of your kernel_code. Plain PyTorch and Triton code compiles when it first
        runs (in run_correctness); here only its Python syntax and ModelNew are checked.

        Args:
            kernel_code: your complete Python file: imports, kernel sources, the load_inline
                call and class ModelNew(nn.Module).
        """
        cand = ctx.candidate("compile_kernel", kernel_code)
        build = ctx.run("compile_kernel", ctx.session.build, cand)
        text = obs.build_text("compile_kernel", build)
        if build.ok and not backend(cand.backend).compiled:
            text = (
                f"compile_kernel SUCCEEDED: the {cand.backend} candidate passed the static checks "
                f"(Python syntax, ModelNew defined); its code compiles when it first runs."
            )
        outcome = "built" if build.ok else "compile_error"
        return Observation("compile_kernel", text, outcome, code=kernel_code, build=build)

    return tool(compile_kernel)


def run_correctness(ctx: ToolContext) -> Tool[Observation]:
    """The ``run_correctness`` tool: build if needed, then the correctness trials."""

    def run_correctness(kernel_code: str) -> Observation:
        """Check your candidate against the reference on fresh random inputs.

        Builds it if needed, then runs the correctness trials on the public shapes. Returns
        PASSED with the numerical precision (max_abs_err, mean_abs_err, max_rel_err), or
        FAILED with the first mismatching elements (index, expected, got), the compiler
        errors, or the runtime error.

        Args:
            kernel_code: your complete Python file defining ModelNew.
        """
        cand = ctx.candidate("run_correctness", kernel_code)
        verdict = ctx.run("run_correctness", ctx.session.check, cand)
        passed = verdict.status is Status.CORRECT
        return Observation(
            "run_correctness",
            obs.check_text("run_correctness", verdict),
            "passed" if passed else "failed",
            code=kernel_code,
            verdict=verdict,
            passed=passed,
        )

    return tool(run_correctness)


def run_benchmark(ctx: ToolContext) -> Tool[Observation]:
    """The ``run_benchmark`` tool: one correctness trial, timing, and a profile."""

    def run_benchmark(kernel_code: str) -> Observation:
        """Time your candidate against the PyTorch reference.

        Checks one trial for correctness, then times your kernel and the reference (PyTorch
        eager, and torch.compile) alternately on the same device: median times with their
        spread, and the speedup with its 95% confidence interval. Then profiles your
        ModelNew.forward and lists the kernels that ran with their share of the time.

        Args:
            kernel_code: your complete Python file defining ModelNew.
        """
        cand = ctx.candidate("run_benchmark", kernel_code)
        verdict = ctx.run("run_benchmark", ctx.session.benchmark, cand)
        passed = verdict.status is Status.CORRECT
        rows = None
        profile = None
        if passed and ctx.session.config.profile:
            rows, note = ctx.session.profile(cand)
            kind = verdict.device.kind if verdict.device else "cpu"
            profile = obs.profile_text(rows, note, kind, ctx.session.config.profile_calls)
        return Observation(
            "run_benchmark",
            obs.benchmark_text("run_benchmark", verdict, profile),
            verdict.status.value,
            code=kernel_code,
            verdict=verdict,
            profile=tuple(rows) if rows is not None else None,
            passed=passed,
        )

    return tool(run_benchmark)


def submit_kernel(ctx: ToolContext) -> Tool[Observation]:
    """The ``submit_kernel`` tool: the full evaluation; its observation ends the episode."""

    def submit_kernel(kernel_code: str) -> Observation:
        """Submit your final kernel for the full evaluation. This ends the episode.

        Runs more correctness trials on unseen inputs, including held-out shapes, then times
        your kernel against the reference. The reward is 0 unless the kernel is correct and
        grows with its speedup. Submit code that passed run_correctness.

        Args:
            kernel_code: your complete Python file defining ModelNew.
        """
        cand = ctx.candidate("submit_kernel", kernel_code)
        verdict = ctx.run("submit_kernel", ctx.session.submit, cand)
        reward = ctx.reward(verdict)
        return Observation(
            "submit_kernel",
            obs.submit_text("submit_kernel", verdict, reward),
            verdict.status.value,
            code=kernel_code,
            verdict=verdict,
            submitted=True,
            reward=reward,
        )

    return tool(submit_kernel)


def default_tools(ctx: ToolContext) -> list[Tool[Observation]]:
    """The four tools, in :data:`TOOL_NAMES` order."""
    return [compile_kernel(ctx), run_correctness(ctx), run_benchmark(ctx), submit_kernel(ctx)]
