"""The backends a candidate can use: one frozen record per backend, and detection from source.

Every fact the judge keeps about a backend lives in :data:`REGISTRY`; the names other modules
import (:data:`BACKENDS`, :data:`GPU_BACKENDS`, :data:`IMPORT_ONLY_BACKENDS`) are derived from
it. :func:`detect_backend` reads a candidate's source and names its backend.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kerneljudge.errors import CandidateError

__all__ = [
    "BACKENDS",
    "BY_NAME",
    "GPU_BACKENDS",
    "IMPORT_ONLY_BACKENDS",
    "REGISTRY",
    "Backend",
    "backend",
    "detect_backend",
]


@dataclass(frozen=True)
class Backend:
    """What the judge knows of one backend.

    Attributes:
        name: the backend's name (``cuda``, ``cpp``, ``triton``, ``torch``).
        description: what a candidate of this backend is, in a few words.
        needs_gpu: its kernels run on a CUDA device (a CPU-only judge cannot run it).
        compiled: it has an ahead-of-time compile step (``load_inline``); False: it is built
            by importing the module (plain PyTorch; Triton compiles on the first call).
        custom_kernel: the candidate defines kernels of its own (False for plain PyTorch).
    """

    name: str
    description: str
    needs_gpu: bool
    compiled: bool
    custom_kernel: bool


#: Every backend, in the order :data:`BACKENDS` lists them.
REGISTRY: tuple[Backend, ...] = (
    Backend("cuda", "load_inline with CUDA sources", True, True, True),
    Backend("cpp", "load_inline with C++ sources only (CPU)", False, True, True),
    Backend("triton", "Triton kernels", True, False, True),
    Backend("torch", "plain PyTorch (no custom kernel)", False, False, False),
)

#: The records by name (read-only).
BY_NAME: Mapping[str, Backend] = MappingProxyType({b.name: b for b in REGISTRY})

#: The backend names: ``cuda``, ``cpp``, ``triton``, ``torch``.
BACKENDS: tuple[str, ...] = tuple(b.name for b in REGISTRY)
#: Backends whose kernels run on a CUDA device.
GPU_BACKENDS: frozenset[str] = frozenset(b.name for b in REGISTRY if b.needs_gpu)
#: Backends with no ahead-of-time compile step (Triton compiles on the first call, on the GPU).
IMPORT_ONLY_BACKENDS: frozenset[str] = frozenset(b.name for b in REGISTRY if not b.compiled)


def backend(name: str) -> Backend:
    """The record of the backend called ``name``.

    Raises:
        CandidateError: no backend has that name.
    """
    found = BY_NAME.get(name)
    if found is None:
        raise CandidateError(f"unknown backend {name!r} (use one of {', '.join(BACKENDS)})")
    return found


def detect_backend(source: str) -> str:
    """The backend a candidate's source uses, from what it imports and calls.

    A line that imports triton (``import triton``, ``from triton ...``) makes it ``triton``,
    whatever else it calls. Otherwise a call of any function named ``load_inline`` or ``load``
    (``cpp_extension.load``, but also e.g. ``torch.load``) makes it ``cuda`` when such a call
    passes ``cuda_sources`` or ``with_cuda``, or three positional arguments, or the source
    holds ``__global__`` or ``<<<`` anywhere, and ``cpp`` otherwise; with no such call it is
    plain ``torch``. Calls are found in the syntax tree, so the words in a comment or docstring
    do not count; a file that does not parse falls back to searching the text.

    Returns:
        One of :data:`BACKENDS`.
    """
    if re.search(r"^\s*(import triton|from triton\b)", source, re.MULTILINE):
        return "triton"
    try:
        tree = ast.parse(source)
    except SyntaxError:
        if re.search(r"\bload_inline\b|\bcpp_extension\.load\b", source):
            return "cuda" if re.search(r"\bcuda_sources\s*=|__global__|<<<", source) else "cpp"
        return "torch"
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
        in ("load_inline", "load")
    ]
    if not calls:
        return "torch"
    cuda_kw = any(kw.arg in ("cuda_sources", "with_cuda") for c in calls for kw in c.keywords)
    cuda_kw = cuda_kw or any(len(c.args) >= 3 for c in calls)  # load_inline(name, cpp, cuda)
    if cuda_kw or re.search(r"__global__|<<<", source):
        return "cuda"
    return "cpp"
