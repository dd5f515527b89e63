"""The agent-facing tools: ``compile_kernel``, ``run_correctness``, ``run_benchmark``,
``submit_kernel``.

Each factory takes the episode's :class:`ToolContext` and returns a :class:`Tool`; the inner
function's docstring is the description the model reads and its signature the JSON schema.
"""

from __future__ import annotations

from kerneljudge.build import IMPORT_ONLY_BACKENDS
from kerneljudge.env import observations as obs
from kerneljudge.env._context import ToolContext
from kerneljudge.env._tool import Tool, tool
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


def compile_kernel(ctx: ToolContext) -> Tool:
    """The ``compile_kernel`` tool: build only."""

    def compile_kernel(kernel_code: str) -> str:
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
        ctx.report.build = build
        ctx.report.outcome = "built" if build.ok else "compile_error"
        text = obs.build_text("compile_kernel", build)
        if build.ok and cand.backend in IMPORT_ONLY_BACKENDS:
            text = (
                f"compile_kernel SUCCEEDED: the {cand.backend} candidate passed the static checks "
                f"(Python syntax, ModelNew defined); its code compiles when it first runs."
            )
        return text

    return tool(compile_kernel)


def run_correctness(ctx: ToolContext) -> Tool:
    """The ``run_correctness`` tool: build if needed, then the correctness trials."""

    def run_correctness(kernel_code: str) -> str:
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
        ctx.report.verdict = verdict
        ctx.report.passed = verdict.status is Status.CORRECT
        ctx.report.outcome = "passed" if ctx.report.passed else "failed"
        return obs.check_text("run_correctness", verdict)

    return tool(run_correctness)


def run_benchmark(ctx: ToolContext) -> Tool:
    """The ``run_benchmark`` tool: one correctness trial, timing, and a profile."""

    def run_benchmark(kernel_code: str) -> str:
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
        ctx.report.verdict = verdict
        ctx.report.passed = verdict.status is Status.CORRECT
        ctx.report.outcome = verdict.status.value
        profile = None
        if ctx.report.passed and ctx.session.config.profile:
            rows, note = ctx.session.profile(cand)
            ctx.report.profile = rows
            kind = verdict.device.kind if verdict.device else "cpu"
            profile = obs.profile_text(rows, note, kind, ctx.session.config.profile_calls)
        return obs.benchmark_text("run_benchmark", verdict, profile)

    return tool(run_benchmark)


def submit_kernel(ctx: ToolContext) -> Tool:
    """The ``submit_kernel`` tool: the full evaluation; ends the episode."""

    def submit_kernel(kernel_code: str) -> str:
        """Submit your final kernel for the full evaluation. This ends the episode.

        Runs more correctness trials on unseen inputs, including held-out shapes, then times
        your kernel against the reference. The reward is 0 unless the kernel is correct and
        grows with its speedup. Submit code that passed run_correctness.

        Args:
            kernel_code: your complete Python file defining ModelNew.
        """
        cand = ctx.candidate("submit_kernel", kernel_code)
        verdict, reward = ctx.run("submit_kernel", ctx.submit, cand)
        ctx.report.verdict = verdict
        ctx.report.submitted = True
        ctx.report.outcome = verdict.status.value if verdict else "failed"
        return obs.submit_text("submit_kernel", verdict, reward)

    return tool(submit_kernel)


def default_tools(ctx: ToolContext) -> list[Tool]:
    """The four tools, in :data:`TOOL_NAMES` order."""
    return [compile_kernel(ctx), run_correctness(ctx), run_benchmark(ctx), submit_kernel(ctx)]
