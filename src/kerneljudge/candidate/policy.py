"""Judging policy: when a problem requires a custom kernel, ``ModelNew`` may not be the reference
in disguise.

Two lines of evidence, both needed because each alone is easy to dodge:

* static, from the candidate's syntax tree: ``ModelNew`` inheriting ``Model``, importing the
  problem or kerneljudge, a plain-PyTorch backend;
* dynamic, from the correctness trials: the ATen operators the forward ran (recorded in the
  worker with a ``TorchDispatchMode``; operators called from C++ extensions pass the dispatcher
  too, custom CUDA/Triton kernels do not). A forward that runs one of the problem's compute
  operators (matrix products, softmax, normalisation, convolution, attention, scans) is
  rejected, including when it only falls back to them in an ``except``.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from kerneljudge.candidate.backends import BY_NAME

__all__ = [
    "CUSTOM_KERNEL_REQUIRED",
    "DEFAULT_FORBIDDEN_OPS",
    "cpp_ops_called",
    "forbidden_ops",
    "forbidden_ops_used",
    "ops_reason",
    "requires_custom_kernel",
    "static_issues",
    "static_reason",
]

#: ATen operator names (overload packets) that do a problem's heavy lifting.
DEFAULT_FORBIDDEN_OPS = frozenset(
    {
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "matmul",
        "linear",
        "einsum",
        "tensordot",
        "_scaled_mm",
        "_int_mm",
        "_weight_int8pack_mm",
        "_softmax",
        "softmax",
        "_log_softmax",
        "log_softmax",
        "logsumexp",
        "native_layer_norm",
        "layer_norm",
        "_fused_rms_norm",
        "rms_norm",
        "native_group_norm",
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "cudnn_convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "scaled_dot_product_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
        "cumsum",
        "cumprod",
        "nll_loss_forward",
        "cross_entropy_loss",
        "topk",
        "sort",
    }
)


#: Internals that switch off or probe the dispatch machinery the judge records operators with.
_DISPATCH_ESCAPES = (
    "_DisableTorchDispatch",
    "_len_torch_dispatch_stack",
    "_ExcludeDispatchKeyGuard",
    "DisableTorchFunction",
    "_pop_torch_dispatch_stack",
    "_python_dispatch",
    "_get_dispatch_mode",
    "_RestorePythonTLSSnapshot",
)


def requires_custom_kernel(policy: dict[str, Any]) -> bool:
    return bool(policy.get("require_custom_kernel"))


def forbidden_ops(policy: dict[str, Any]) -> frozenset[str]:
    """The operators the policy forbids: ``POLICY["forbidden_ops"]`` (a problem that allows some
    of PyTorch's operators beside its custom kernel, e.g. a LayerNorm before the fused core),
    else :data:`DEFAULT_FORBIDDEN_OPS`."""
    return frozenset(policy.get("forbidden_ops", DEFAULT_FORBIDDEN_OPS))


def forbidden_ops_used(ops: list[str], policy: dict[str, Any]) -> list[str]:
    """The recorded operators the policy forbids (see :func:`forbidden_ops`)."""
    return sorted(set(ops) & forbidden_ops(policy))


#: How every policy rejection's reason begins (verdicts and the agent's observations).
CUSTOM_KERNEL_REQUIRED = "this problem requires a custom kernel"


def static_reason(issue: str) -> str:
    """A rejection's reason for one of :func:`static_issues`' findings."""
    return f"{CUSTOM_KERNEL_REQUIRED}: {issue}"


def ops_reason(used: list[str]) -> str:
    """A rejection's reason for a forward that ran the forbidden operators ``used`` (itself or
    as a fallback)."""
    return (
        f"{CUSTOM_KERNEL_REQUIRED}, but the forward ran PyTorch's own compute operators "
        f"{', '.join(used)} (directly or as a fallback)"
    )


#: Operators whose C++ spelling in a candidate's extension source means "call PyTorch's own".
_CPP_OPS = sorted(
    DEFAULT_FORBIDDEN_OPS | {"conv2d", "conv1d", "layer_norm", "softmax", "log_softmax"}, key=len
)[::-1]
_CPP_CALL = re.compile(
    r"\b(?:at|torch)::(?:[A-Za-z_]\w*::)*(" + "|".join(map(re.escape, _CPP_OPS)) + r")\s*\("
    r"|\.\s*(" + "|".join(map(re.escape, _CPP_OPS)) + r")\s*\("
)


def cpp_ops_called(source: str, forbidden: frozenset[str] = DEFAULT_FORBIDDEN_OPS) -> list[str]:
    """Operators of ``forbidden`` called from the C++/CUDA source strings of a candidate
    (``at::matmul(...)``, ``at::native::mm(...)``, ``x.mm(y)``, ``at::_ops::mm::call(...)``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if not re.search(r"torch::|at::|#include|__global__", text):
                continue
            for m in _CPP_CALL.finditer(text):
                found.append(m.group(1) or m.group(2))
            found += re.findall(r"\bat::_ops::(\w+)::", text)
    return sorted(set(found) & (set(_CPP_OPS) | DEFAULT_FORBIDDEN_OPS) & forbidden)


def static_issues(source: str, backend: str, policy: dict[str, Any] | None = None) -> list[str]:
    """Reasons, read off the source, why this candidate is not a custom kernel (operators its
    C++ source calls count when ``policy`` forbids them, see :func:`forbidden_ops`)."""
    issues = []
    record = BY_NAME.get(backend)
    if record is not None and not record.custom_kernel:
        issues.append("the candidate is plain PyTorch (no load_inline or Triton kernel)")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return issues
    for name in _DISPATCH_ESCAPES:
        if name in source:
            issues.append(f"the candidate uses {name}, which hides operators from the judge")
    called = cpp_ops_called(source, forbidden_ops(policy or {}))
    if called:
        issues.append("its C++ source calls PyTorch's own " + ", ".join(called))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                if name == "Model":
                    issues.append("ModelNew inherits the reference Model")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for full in ([module] if module else []) + names:
                if full and (full.startswith("kerneljudge") or full.endswith("problems")):
                    issues.append(f"the candidate imports {full}")
    return list(dict.fromkeys(issues))
