"""Observations: what a tool call returns (:class:`Observation`) and the texts the model reads.

They follow the shape agents already know, e.g.::

    run_correctness PASSED: (5 / 5) trials all matched the reference. Numerical precision:
    max_abs_err=1.22e-04 mean_abs_err=1.46e-05 max_rel_err=6.14e-02

Compiler errors come first and name lines of the submitted code; runtime errors come in a few
lines; timings carry their spread and the speedup's 95% interval. The budget line is added by
the environment, not here.

Every tool returns one frozen :class:`Observation`: its text, the verdict or build result the
text came from, and the details the environment, its state and transcripts read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kerneljudge.candidate.policy import CUSTOM_KERNEL_REQUIRED
from kerneljudge.verdict import BuildResult, CheckResult, Status, Verdict
from kerneljudge.verdict.render import graph_lines, noise_line

__all__ = [
    "Observation",
    "benchmark_text",
    "build_text",
    "check_text",
    "compiler_errors",
    "failure_text",
    "profile_text",
    "submit_text",
]

_MAX_LOG_CHARS = 3500
_MAX_TAIL_LINES = 20
_MAX_RUNTIME_LINES = 12
_GENERATED = re.compile(
    r"(?:/[^\s:'\"()]+)+/((?:main|cuda)\.(?:cpp|cu)|[\w.-]+\.(?:cpp|cu|cuh|h|py))"
)
_COMMAND = re.compile(r"^\s*(\[\d+/\d+\]\s|FAILED:|c\+\+ |g\+\+ |gcc |clang|\S*nvcc |ninja: )")
_BASELINE_NAMES = {"eager": "PyTorch eager", "compile": "torch.compile"}


@dataclass(frozen=True)
class Observation:
    """What one tool call returns.

    Attributes:
        tool: the tool's name as the model called it.
        text: the text for the model (the environment appends the budget line to it).
        outcome: ``passed``/``failed`` (run_correctness), ``built``/``compile_error``
            (compile_kernel), the verdict's status (run_benchmark, submit_kernel), or
            ``tool_error``.
        error: a tool error's message, "" otherwise.
        code: the ``kernel_code`` the call was given; None when the call stopped before
            reading it (bad arguments, empty code, an unknown tool).
        verdict: the verdict of run_correctness, run_benchmark or submit_kernel; None
            otherwise.
        build: compile_kernel's build result; None otherwise.
        profile: run_benchmark's profile rows (``name, device_time_ms, calls, share, own``);
            None when no profile was taken.
        passed: the verdict is ``correct`` (run_correctness, run_benchmark): the code becomes
            the episode's last passing code.
        submitted: submit_kernel evaluated the code; the episode ends with :attr:`verdict`.
        reward: submit_kernel's reward (the environment's reward function of the verdict);
            None otherwise.
    """

    tool: str
    text: str
    outcome: str
    error: str = ""
    code: str | None = None
    verdict: Verdict | None = None
    build: BuildResult | None = None
    profile: tuple[dict[str, Any], ...] | None = None
    passed: bool = False
    submitted: bool = False
    reward: float | None = None

    @classmethod
    def tool_error(cls, tool: str, message: str, known: bool, code: str | None) -> Observation:
        """The observation of a tool error.

        Args:
            tool: the name the model called.
            message: what went wrong, written for the model.
            known: the tool exists (its name labels the text; else the text starts
                ``ERROR:``).
            code: the code the call was given, when it had been read.
        """
        label = f"{tool} ERROR" if known else "ERROR"
        return cls(tool, f"{label}: {message}", "tool_error", error=message, code=code)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the verdict and build as their own dicts, the profile a list)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["verdict"] = self.verdict.to_dict() if self.verdict else None
        out["build"] = dataclasses.asdict(self.build) if self.build else None
        out["profile"] = list(self.profile) if self.profile is not None else None
        return out


def _short_paths(text: str) -> str:
    """Absolute paths of generated sources reduced to their file names."""
    return _GENERATED.sub(r"\1", text)


def compiler_errors(build: BuildResult) -> str:
    """The shaped compiler log for the model: mapped errors first, then a filtered tail.

    Command lines of the build tool are dropped, paths inside the build tree are shortened to
    file names, and the text is capped at about 3,500 characters.
    """
    log = build.log or ""
    head, _, tail = log.partition("--- compiler output")
    head = _short_paths(head.strip())
    kept = [
        ln
        for ln in _short_paths(tail).splitlines()[1:]
        if ln.strip() and not _COMMAND.match(ln) and "cpp_extension.py" not in ln
    ]
    text = head
    if kept:
        text += "\n--- compiler output (last lines) ---\n" + "\n".join(kept[-_MAX_TAIL_LINES:])
    if not text.strip():
        text = (
            "\n".join(
                f"line {m.candidate_line or m.line or '?'}: {m.severity}: {m.message}"
                for m in build.messages
            )
            or "the build failed without a message"
        )
    if len(text) > _MAX_LOG_CHARS:
        text = text[:_MAX_LOG_CHARS].rstrip() + "\n... (truncated)"
    return text


def build_text(tool: str, build: BuildResult) -> str:
    """``compile_kernel``'s observation: success with the build time, or the compiler errors."""
    if build.ok:
        how = (
            f"(cached build; it took {build.duration_s:.1f} s)"
            if build.cached
            else f"in {build.duration_s:.1f} s"
        )
        return f"{tool} SUCCEEDED: the {build.backend} candidate built {how}."
    if build.timed_out:
        return f"{tool} FAILED: the build did not finish in time.\n{compiler_errors(build)}"
    n_err = sum(m.severity == "error" for m in build.messages) or 1
    noun = "error" if n_err == 1 else "errors"
    return (
        f"{tool} FAILED: compilation failed with {n_err} {noun} (line numbers are lines of your "
        f"kernel_code).\n{compiler_errors(build)}"
    )


def _precision(check: CheckResult) -> str:
    trials = check.trials
    mean = sum(t.mean_abs_err for t in trials) / len(trials) if trials else 0.0
    return (
        f"Numerical precision: max_abs_err={check.worst('max_abs_err'):.2e} "
        f"mean_abs_err={mean:.2e} max_rel_err={check.worst('max_rel_err'):.2e}"
    )


def _mismatches(check: CheckResult) -> str:
    bad = next((t for t in check.trials if not t.passed), None)
    if bad is None or not bad.mismatches:
        return ""
    items = "; ".join(
        f"index {tuple(m.index)}: expected {m.expected:.6g}, got {m.got:.6g}"
        for m in bad.mismatches
    )
    return f"\nFirst mismatching elements (trial {bad.index}): {items}"


def _oracle_note(check: CheckResult) -> str:
    if check.mode != "oracle":
        return ""
    worst = max(
        (t for t in check.trials if t.oracle_err is not None and t.oracle_bound),
        key=lambda t: (t.oracle_err or 0.0) / (t.oracle_bound or 1.0),
        default=None,
    )
    if worst is None:
        return ""
    return (
        f"\nAgainst the float64 reference: error {worst.oracle_err:.2e} (allowed "
        f"{worst.oracle_bound:.2e}); allclose(atol={check.atol:g}, rtol={check.rtol:g}) held "
        f"on {sum(t.allclose for t in check.trials)} of {len(check.trials)} trials."
    )


def _runtime_lines(verdict: Verdict) -> str:
    """The runtime error in a few lines: the reason, then the worker's last distinct lines."""
    lines: list[str] = []
    for ln in (verdict.worker_log or "").splitlines():
        ln = _short_paths(ln.rstrip())
        if not ln.strip() or ln.strip() == verdict.reason.strip() or ln in lines:
            continue
        if ln.lstrip().startswith(("W1", "I1", "warnings.warn")):
            continue
        lines.append(ln)
    if len(lines) > _MAX_RUNTIME_LINES:
        lines = lines[:4] + ["..."] + lines[-(_MAX_RUNTIME_LINES - 5) :]
    return ("\n" + "\n".join(lines)) if lines else ""


def failure_text(tool: str, verdict: Verdict) -> str:
    """The observation of a verdict that is not ``correct``, for any tool."""
    status = verdict.status
    if status is Status.COMPILE_ERROR and verdict.build is not None:
        return (
            f"{tool} FAILED: your code did not compile (line numbers are lines of your "
            f"kernel_code).\n{compiler_errors(verdict.build)}"
        )
    if status is Status.INCORRECT and verdict.check is not None and verdict.check.trials:
        check = verdict.check
        n = len(check.trials)
        bad = next((t for t in check.trials if not t.passed), None)
        why = f"Trial {bad.index}: {bad.reason}. " if bad and bad.reason else f"{verdict.reason}. "
        text = (
            f"{tool} FAILED: ({check.n_passed} / {n}) trials matched the reference. "
            f"{why}{_precision(check)}"
        )
        return text + _mismatches(check) + _oracle_note(check)
    if status is Status.RUNTIME_ERROR:
        return f"{tool} FAILED: runtime error: {verdict.reason}{_runtime_lines(verdict)}"
    if status is Status.TIMEOUT:
        return f"{tool} FAILED: timeout: {verdict.reason}{_runtime_lines(verdict)}"
    if status is Status.REJECTED:
        hint = ""
        if verdict.reason.startswith(CUSTOM_KERNEL_REQUIRED):
            hint = (
                "\nThe task asks for a custom kernel: do the forward's computation in your own "
                "CUDA/C++ (load_inline) or Triton kernel. PyTorch's compute operators (matmul, "
                "softmax, normalisation, ...) may not do the problem's work, not even as a "
                "fallback when the kernel fails."
            )
        return f"{tool} FAILED: rejected: {verdict.reason}{hint}"
    return f"{tool} FAILED: {status.value}: {verdict.reason}"


def check_text(tool: str, verdict: Verdict) -> str:
    """``run_correctness``'s observation."""
    if verdict.status is not Status.CORRECT or verdict.check is None:
        return failure_text(tool, verdict)
    check = verdict.check
    n = len(check.trials)
    return f"{tool} PASSED: ({n} / {n}) trials all matched the reference. {_precision(check)}"


def _timing_lines(verdict: Verdict) -> list[str]:
    timing = verdict.timing
    if timing is None:
        return ["(no timing)"]
    out = []
    width = max(len(_BASELINE_NAMES.get(m.name, "your kernel")) for m in timing.measurements)
    for m in sorted(timing.measurements, key=lambda m: m.name != "candidate"):
        label = "your kernel" if m.name == "candidate" else _BASELINE_NAMES.get(m.name, m.name)
        out.append(
            f"  {label:<{width}}  median {m.median_ms:.4g} ms  IQR {m.iqr_ms:.2g} ms  "
            f"95% CI {m.ci95_ms[0]:.4g}-{m.ci95_ms[1]:.4g} ms  ({m.samples} samples)"
        )
    for s in timing.speedups:
        out.append(
            f"Speedup over {_BASELINE_NAMES.get(s.baseline, s.baseline)}: {s.median:.3g}x "
            f"(95% CI {s.ci95[0]:.3g}x-{s.ci95[1]:.3g}x)"
        )
    for baseline, why in timing.baseline_errors.items():
        out.append(f"Speedup over {_BASELINE_NAMES.get(baseline, baseline)}: {why}")
    out += [line[0].upper() + line[1:] for line in graph_lines(timing)]
    noise = noise_line(timing)
    if noise:
        out.append(noise[0].upper() + noise[1:])
    if timing.timer_note:
        out.append(f"Timer audit: {timing.timer_note}")
    r = timing.roofline
    if r is not None and (r.achieved_gbps or r.achieved_tflops):
        text = f"Throughput: {r.achieved_gbps or 0:.1f} GB/s, {r.achieved_tflops or 0:.3g} TFLOP/s"
        if r.bandwidth_fraction is not None or r.compute_fraction is not None:
            text += (
                f" ({(r.bandwidth_fraction or 0) * 100:.1f}% of peak bandwidth, "
                f"{(r.compute_fraction or 0) * 100:.1f}% of peak FLOP/s)"
            )
        out.append(text)
    return out


def profile_text(rows: Sequence[dict[str, Any]], note: str, device_kind: str, calls: int) -> str:
    """The profile section of ``run_benchmark``: the busiest kernels (or CPU operators)."""
    if note:
        return f"Profile: not available ({note})."
    if not rows:
        return "Profile: the profiler recorded no kernels."
    what = "GPU kernels" if device_kind == "cuda" else "CPU operators (self time)"
    lines = [
        f"Profile of ModelNew.forward ({what}, per forward call, {calls} calls profiled):",
        "  share   time ms   calls  name",
    ]
    for row in rows[:10]:
        name = str(row["name"])
        name = name if len(name) <= 100 else name[:97] + "..."
        mine = "  (yours)" if row.get("own") else ""
        lines.append(
            f"  {row['share'] * 100:5.1f}%  {row['device_time_ms']:8.4f}  {row['calls']:5.3g}  "
            f"{name}{mine}"
        )
    if len(rows) > 10:
        rest = sum(r["share"] for r in rows[10:])
        lines.append(f"  {rest * 100:5.1f}%  ({len(rows) - 10} more)")
    return "\n".join(lines)


def benchmark_text(tool: str, verdict: Verdict, profile: str | None = None) -> str:
    """``run_benchmark``'s observation: correctness, timings, speedups, profile."""
    if verdict.status is not Status.CORRECT:
        return failure_text(tool, verdict)
    check = verdict.check
    n = len(check.trials) if check else 0
    device = verdict.device.name if verdict.device else "the device"
    head = f"{tool}: correct ({n} / {n} trials). Timing on {device}:"
    lines = [head, *_timing_lines(verdict)]
    if profile:
        lines.append(profile)
    return "\n".join(lines)


def submit_text(tool: str, verdict: Verdict | None, reward: float) -> str:
    """``submit_kernel``'s observation: the final verdict, its timing and the reward."""
    if verdict is None:
        return f"{tool}: nothing was evaluated. Final reward: {reward:.3g}."
    if verdict.status is not Status.CORRECT:
        return failure_text(tool, verdict) + f"\nFinal reward: {reward:.3g}. The episode is over."
    check = verdict.check
    n = len(check.trials) if check else 0
    sets = sorted({t.shape_set for t in check.trials}) if check else []
    lines = [
        f"{tool}: CORRECT: ({n} / {n}) trials over {len(sets)} shape "
        f"{'set' if len(sets) == 1 else 'sets'} matched the reference. "
        f"{_precision(check) if check else ''}".rstrip(),
        *_timing_lines(verdict),
        f"Final reward: {reward:.3g}. The episode is over.",
    ]
    return "\n".join(lines)
