"""Candidates: source text that defines ``ModelNew``, its backend, and static checks.

The backends and what is known of each live in :mod:`kerneljudge.candidate.backends`; the custom
kernel policy in :mod:`kerneljudge.candidate.policy`.

Static checks here never import the candidate; they read its syntax tree.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from kerneljudge.candidate.backends import BACKENDS, GPU_BACKENDS, detect_backend
from kerneljudge.candidate.backends import backend as backend_record
from kerneljudge.errors import CandidateError, not_a_file

__all__ = ["BACKENDS", "GPU_BACKENDS", "Candidate", "StaticIssue", "detect_backend"]


@dataclass(frozen=True)
class StaticIssue:
    """A defect found without running the candidate: the message and the 1-based line (if any)."""

    message: str
    line: int | None = None


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
        name_ = backend_record(backend).name if backend is not None else detect_backend(source)
        return cls(source=source, backend=name_, name=name)

    @classmethod
    def from_file(cls, path: str | Path, backend: str | None = None) -> Candidate:
        """Read a candidate file.

        Raises:
            CandidateError: the file is missing, a folder, or not UTF-8 text; unknown backend.
        """
        p = Path(path)
        if not p.is_file():
            raise CandidateError(not_a_file("candidate", path))
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
        """The backend's kernels run on a CUDA device (see :data:`GPU_BACKENDS`)."""
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
