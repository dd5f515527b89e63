"""Candidates: source text that defines ``ModelNew``, its backend, and static checks.

Static checks here never import the candidate; they read its syntax tree.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from kerneljudge.errors import CandidateError

__all__ = ["BACKENDS", "Candidate", "StaticIssue", "detect_backend"]

#: ``cuda``: load_inline with CUDA sources; ``cpp``: load_inline with C++ only (CPU);
#: ``triton``: Triton kernels; ``torch``: plain PyTorch (no custom kernel).
BACKENDS = ("cuda", "cpp", "triton", "torch")
#: Backends whose kernels run on a CUDA device.
GPU_BACKENDS = frozenset({"cuda", "triton"})


@dataclass(frozen=True)
class StaticIssue:
    """A defect found without running the candidate: the message and the 1-based line (if any)."""

    message: str
    line: int | None = None


def detect_backend(source: str) -> str:
    """The backend a candidate's source uses, from what it imports and calls.

    A line that imports triton (``import triton``, ``from triton ...``) makes it ``triton``,
    whatever else it calls. Otherwise a call of any function named ``load_inline`` or ``load``
    (``cpp_extension.load``, but also e.g. ``torch.load``) makes it ``cuda`` when such a call
    passes ``cuda_sources`` or ``with_cuda``, or three positional arguments, or the source
    holds ``__global__`` or ``<<<`` anywhere, and ``cpp`` otherwise; with no such call it is
    plain ``torch``. Calls are found in the syntax tree, so the words in a comment or docstring
    do not count; a file that does not parse falls back to searching the text.
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


@dataclass(frozen=True)
class Candidate:
    """A candidate's source and what is known of it before it runs.

    Attributes:
        source: the Python source text.
        backend: one of :data:`BACKENDS`.
        path: the file it came from (None for text given directly).
        name: a display name (the file name, or ``"candidate"``).
    """

    source: str
    backend: str
    path: Path | None = None
    name: str = "candidate"

    @classmethod
    def from_source(
        cls, source: str, backend: str | None = None, name: str = "candidate"
    ) -> Candidate:
        """A candidate from text; ``backend`` None means detect it.

        Raises:
            CandidateError: ``backend`` is not one of :data:`BACKENDS`.
        """
        if backend is not None and backend not in BACKENDS:
            raise CandidateError(f"unknown backend {backend!r} (use one of {', '.join(BACKENDS)})")
        return cls(source=source, backend=backend or detect_backend(source), name=name)

    @classmethod
    def from_file(cls, path: str | Path, backend: str | None = None) -> Candidate:
        """Read a candidate file.

        Raises:
            CandidateError: the file is missing, a folder, or not UTF-8 text; unknown backend.
        """
        p = Path(path)
        if not p.is_file():
            raise CandidateError(f"candidate file not found: {path}")
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            raise CandidateError(f"cannot read candidate {path}: {exc}") from None
        cand = cls.from_source(text, backend=backend, name=p.name)
        return cls(source=cand.source, backend=cand.backend, path=p.resolve(), name=p.name)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def needs_gpu(self) -> bool:
        return self.backend in GPU_BACKENDS

    def static_issues(self) -> list[StaticIssue]:
        """Defects that make running pointless: an empty source or a syntax error.

        Whether ``ModelNew`` exists is left to the build, which imports the module: Python may
        define it in an ``if``/``else``, a ``try``, a loop, an assignment ``ModelNew = make()``
        or an import, none of which a reading of the syntax tree can settle.
        """
        if not self.source.strip():
            return [StaticIssue("the candidate is empty")]
        try:
            ast.parse(self.source)
        except SyntaxError as exc:
            return [StaticIssue(f"Python syntax error: {exc.msg}", exc.lineno)]
        return []
