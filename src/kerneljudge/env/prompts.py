"""Prompt templates: text files a user can replace.

The bundled templates live in ``kerneljudge/env/prompts/``: ``system.md`` (the system message),
``task.md`` (the task prompt), ``last_call.md`` and ``last_turn.md`` (the notices before the
last tool call and the last reply), ``no_tool_call.md`` (the reminder after a reply without a
tool call) and ``exhausted.md`` (the budget ran out). ``EnvConfig(prompt_dir=...)`` names a folder
whose files replace the bundled ones of the same name; missing files fall back to the bundle. A
``prompt_dir`` that does not exist or is not a folder is an error (:func:`check_prompt_dir`).

Templates use :class:`string.Template` syntax: ``$name`` or ``${name}`` is replaced, ``$$`` is a
literal dollar sign. A leading ``<!-- ... -->`` comment (where each template lists its
variables) is removed. A variable the renderer does not know is an error.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path
from typing import Any

from kerneljudge.env.config import EnvConfig
from kerneljudge.problem import Problem
from kerneljudge.verdict import DeviceInfo

__all__ = [
    "TEMPLATE_NAMES",
    "bundled_prompts_dir",
    "check_prompt_dir",
    "describe_device_text",
    "dtype_short",
    "exhausted_policy_text",
    "format_tolerance",
    "load_template",
    "reference_for_prompt",
    "render",
    "task_variables",
]

#: The template files the environment reads.
TEMPLATE_NAMES = (
    "system.md",
    "task.md",
    "last_call.md",
    "last_turn.md",
    "no_tool_call.md",
    "exhausted.md",
)
_COMMENT = re.compile(r"^\s*<!--.*?-->\s*", re.DOTALL)
_META_NAMES = frozenset(
    {"NAME", "DESCRIPTION", "TAGS", "DTYPE", "TOLERANCE", "SHAPE_SETS", "POLICY"}
)
_META_FUNCS = frozenset({"flop_count", "byte_count"})
_DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def bundled_prompts_dir() -> Path:
    """The folder of the bundled templates."""
    return Path(__file__).resolve().parent / "prompts"


def check_prompt_dir(prompt_dir: str | Path | None) -> None:
    """Check that ``prompt_dir`` (when given) is a folder.

    Raises:
        FileNotFoundError: it does not exist.
        NotADirectoryError: it is not a folder.
    """
    if not prompt_dir:
        return
    path = Path(prompt_dir)
    if not path.exists():
        raise FileNotFoundError(f"the prompt folder {path} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"the prompt folder {path} is not a folder")


def load_template(name: str, prompt_dir: str | Path | None = None) -> str:
    """The text of template ``name`` (its leading comment removed).

    Args:
        name: a file name from :data:`TEMPLATE_NAMES`.
        prompt_dir: a folder whose file of that name wins over the bundled one (a folder
            without it: the bundled one).

    Raises:
        FileNotFoundError: ``prompt_dir`` does not exist, or no such template, neither in
            ``prompt_dir`` nor bundled.
        NotADirectoryError: ``prompt_dir`` is not a folder.
    """
    check_prompt_dir(prompt_dir)
    for folder in ([Path(prompt_dir)] if prompt_dir else []) + [bundled_prompts_dir()]:
        path = folder / name
        if path.is_file():
            return _COMMENT.sub("", path.read_text(encoding="utf-8"), count=1).strip()
    raise FileNotFoundError(
        f"no prompt template {name!r} (bundled ones: {', '.join(TEMPLATE_NAMES)})"
    )


def render(name: str, prompt_dir: str | Path | None = None, **values: Any) -> str:
    """Template ``name`` with ``values`` filled in.

    Raises:
        FileNotFoundError: see :func:`load_template`.
        ValueError: the template uses a variable not in ``values``, or a stray ``$``.
    """
    text = load_template(name, prompt_dir)
    try:
        return string.Template(text).substitute({k: str(v) for k, v in values.items()})
    except KeyError as exc:
        known = ", ".join(f"${k}" for k in sorted(values))
        raise ValueError(
            f"prompt template {name} uses unknown variable ${exc.args[0]} (known: {known})"
        ) from None
    except ValueError as exc:
        raise ValueError(f"prompt template {name}: {exc} (write $$ for a dollar sign)") from None


def reference_for_prompt(problem: Problem) -> str:
    """The reference source as the task prompt shows it.

    The judge's metadata (``NAME``, ``DESCRIPTION``, ``TAGS``, ``DTYPE``, ``TOLERANCE``,
    ``SHAPE_SETS``, ``POLICY``, ``flop_count``, ``byte_count``) is removed, so held-out shapes
    stay unseen, and the shape globals take their ``public`` values. A source that does not
    parse is shown as it is.
    """
    source = problem.source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source.strip()
    public = problem.shape_sets.get("public", {})
    lines = source.splitlines()
    edits: list[tuple[int, int, list[str]]] = []  # (first line, last line, replacement), 1-based
    for node in tree.body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        last = node.end_lineno or node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _META_FUNCS:
            edits.append((first, last, []))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and all(n in _META_NAMES for n in names):
                edits.append((first, last, []))
            elif len(names) == 1 and names[0] in public and len(targets) == 1:
                edits.append((first, last, [f"{names[0]} = {public[names[0]]!r}"]))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1 : last] = replacement
    text = "\n".join(lines).strip()
    return re.sub(r"\n{4,}", "\n\n\n", text)


def dtype_short(problem: Problem) -> str:
    """``fp32``, ``fp16``, ``bf16``: the problem's dtype as the prompts name it."""
    name = str(problem.dtype).removeprefix("torch.")
    return _DTYPE_SHORT.get(name, name)


def exhausted_policy_text(config: EnvConfig) -> str:
    """One sentence: what happens when the budget runs out without a submission."""
    if config.on_exhausted == "submit_last_passing":
        return (
            "If the budget runs out before you call submit_kernel, the last kernel that passed "
            "run_correctness is submitted for you; without one the episode counts as failed."
        )
    if config.on_exhausted == "submit_last":
        return (
            "If the budget runs out before you call submit_kernel, the last kernel you passed to "
            "any tool is submitted for you."
        )
    return "If the budget runs out before you call submit_kernel, the episode counts as failed."


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB" if n else "unknown"


def describe_device_text(info: DeviceInfo, baselines: tuple[str, ...]) -> str:
    """The device paragraph of the task prompt: name, SMs, memory, peaks, how timing works."""
    names = {"eager": "PyTorch eager", "compile": "torch.compile"}
    against = " and ".join(names[b] for b in baselines) or "nothing"
    if info.kind != "cuda":
        return (
            f"the CPU ({info.name}, {info.sm_count} hardware threads). Timing uses a monotonic "
            f"clock, alternating your kernel with the reference ({against})."
        )
    parts = [f"{info.name}"]
    if info.capability:
        parts[0] += f" (compute capability {info.capability})"
    parts.append(f"{info.sm_count} SMs")
    parts.append(f"{_gib(info.memory_bytes)} memory")
    if info.l2_bytes:
        parts.append(f"{info.l2_bytes / 2**20:.0f} MiB L2")
    text = ", ".join(parts) + "."
    spec = _lookup_spec(info.name)
    if spec is not None:
        peaks = [
            f"peak memory bandwidth {spec.memory_bandwidth_bytes_s / 1e12:.2f} TB/s",
            f"FP32 {spec.fp32_tflops:g} TFLOP/s",
        ]
        if spec.tf32_tflops:
            peaks.append(f"TF32 tensor cores {spec.tf32_tflops:g} TFLOP/s")
        if spec.bf16_tflops:
            peaks.append(f"BF16/FP16 tensor cores {spec.bf16_tflops:g} TFLOP/s")
        text += " Datasheet peaks (dense): " + ", ".join(peaks) + "."
    text += (
        f" Timing uses CUDA events with a device-wide synchronisation, the L2 cache flushed "
        f"between calls and fresh inputs, alternating your kernel with the reference ({against})."
    )
    return text


def _lookup_spec(name: str) -> Any:
    """The datasheet entry of a GPU name, or None (unknown GPU, or no device table)."""
    try:
        from kerneljudge.timing import roofline
    except ImportError:  # pragma: no cover - the device table ships with the package
        return None
    return roofline.lookup(name) if name.strip().lower() != "cpu" else None


def format_tolerance(x: float) -> str:
    """A tolerance as the prompts write it: ``1e-4``, ``1e-2``, ``2.5e-3``."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def _correctness_rule(problem: Problem, config: EnvConfig) -> str:
    atol, rtol = problem.tolerance
    dt = dtype_short(problem)
    a, r = format_tolerance(atol), format_tolerance(rtol)
    tol = f"atol=rtol={a}" if a == r else f"atol={a} rtol={r}"
    head = f"Outputs must match the reference within tolerance: {dt} uses {tol}."
    if config.tolerance == "allclose":
        rule = f"{head} torch.allclose(output, reference, atol, rtol) must hold on every trial."
    else:
        rule = (
            f"{head} The deciding check compares with a float64 evaluation of the reference: "
            f"your largest error against it may be at most 16 times the {dt} reference's own "
            f"rounding error (with a floor scaled to the output's magnitude), so a kernel that "
            f"only sums in another order passes, while one that computes at lower precision "
            f"fails. Both numbers are reported."
        )
    return (
        f"{rule} run_correctness runs {config.trials} trials with fresh random inputs; "
        f"submit_kernel runs {config.submit_trials} trials per shape set with unseen inputs."
    )


def _kernel_kind(device: DeviceInfo) -> str:
    if device.kind == "cuda":
        return (
            "custom GPU kernels: CUDA through torch.utils.cpp_extension.load_inline (with "
            "cuda_sources), or Triton"
        )
    return (
        "custom C++ code for the CPU through torch.utils.cpp_extension.load_inline (cpp_sources "
        "only; this device has no GPU)"
    )


def task_variables(
    problem: Problem, device: DeviceInfo, config: EnvConfig, tools: list[Any]
) -> dict[str, Any]:
    """The variables of ``task.md`` (and ``system.md``) for one problem.

    Args:
        problem: the problem (its public shape set is the one shown).
        device: the device candidates run on.
        config: the environment's configuration.
        tools: the episode's :class:`~kerneljudge.env.Tool` objects.
    """
    heldout = problem.heldout_shape_sets
    if config.submit_shape_sets is not None:
        heldout = [s for s in config.submit_shape_sets if s != "public"]
    heldout_note = (
        f": submit_kernel also checks {len(heldout)} held-out shape "
        f"{'set' if len(heldout) == 1 else 'sets'} you have not seen"
        if heldout
        else ""
    )
    tool_lines = []
    for t in tools:
        first = t.description.split("\n\n")[0].replace("\n", " ").strip()
        args = ", ".join(t.parameters.get("properties", {}))
        tool_lines.append(f"- {t.name}({args}): {first}")
    budget = (
        f"{config.max_tool_calls} tool calls and {config.max_turns} replies. Every observation "
        f"ends with what is left."
    )
    atol, rtol = problem.tolerance
    return {
        "problem_name": problem.name,
        "description": problem.description,
        "reference_source": reference_for_prompt(problem),
        "dtype": dtype_short(problem),
        "atol": format_tolerance(atol),
        "rtol": format_tolerance(rtol),
        "kernel_kind": _kernel_kind(device),
        "correctness_rule": _correctness_rule(problem, config),
        "heldout_note": heldout_note,
        "device": describe_device_text(device, config.baselines),
        "device_name": device.name if device.kind == "cuda" else f"the CPU ({device.name})",
        "tools": "\n".join(tool_lines),
        "budget": budget,
        "exhausted_policy": exhausted_policy_text(config),
        "max_tool_calls": config.max_tool_calls,
        "max_turns": config.max_turns,
        "trials": config.trials,
        "submit_trials": config.submit_trials,
    }
