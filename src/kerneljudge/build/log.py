"""Shaping compiler output for a reader: errors first, each traced to the candidate's own line.

``load_inline`` writes the candidate's C++/CUDA strings into generated files (``main.cpp``,
``cuda.cu``) and the compilers report positions in those. A candidate author knows only their
Python file, so each diagnostic is traced back: the generated line's text is looked up among
the candidate's lines, and among equal lines the one whose neighbours also agree wins.
"""

from __future__ import annotations

import re
from pathlib import Path

from kerneljudge.verdict import CompilerMessage

__all__ = ["map_generated_line", "parse_diagnostics", "shape_log"]

# gcc/clang: path:line:col: error: message
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:\n]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
    r"(?P<sev>fatal error|error|warning):\s*(?P<msg>.*)$"
)
# nvcc front end (EDG): path(line): error #20-D: message
_NVCC = re.compile(
    r"^(?P<file>[^\s(][^(\n]*)\((?P<line>\d+)\):\s*(?P<sev>error|warning)(?:\s*#[\w-]+)?:\s*(?P<msg>.*)$"
)
# ptxas and linker lines without a position
_BARE = re.compile(
    r"^(?:ptxas\s+(?P<sev1>error|fatal)\s*:\s*(?P<msg1>.*)|.*(?P<msg2>undefined reference to .*))$"
)
_CONTEXT = 2
_TAIL_LINES = 60


def parse_diagnostics(text: str) -> list[CompilerMessage]:
    """Compiler diagnostics found in ``text``, in order, without duplicates."""
    seen: set[tuple[str, int | None, str]] = set()
    out: list[CompilerMessage] = []
    for raw in text.splitlines():
        line = raw.strip()
        m = _NVCC.match(line) or _GCC.match(line)
        if m:
            sev = "warning" if m.group("sev") == "warning" else "error"
            msg = CompilerMessage(
                file=m.group("file"),
                line=int(m.group("line")),
                column=int(m.group("col")) if "col" in m.groupdict() and m.group("col") else None,
                severity=sev,
                message=m.group("msg").strip(),
            )
        else:
            b = _BARE.match(line)
            if not b:
                continue
            text_msg = (b.group("msg1") or b.group("msg2") or "").strip()
            msg = CompilerMessage(
                file="", line=None, column=None, severity="error", message=text_msg
            )
        key = (msg.file, msg.line, msg.message)
        if key not in seen:
            seen.add(key)
            out.append(msg)
    return out


def map_generated_line(generated: list[str], line: int, candidate: list[str]) -> int | None:
    """The 1-based candidate line whose text produced ``generated[line - 1]``, or None.

    Among candidate lines equal to the generated one (ignoring surrounding whitespace), the one
    whose neighbours (two either side) also match best wins; a tie between several is None.
    """
    if not 1 <= line <= len(generated):
        return None
    target = generated[line - 1].strip()
    if not target:
        return None
    scores: dict[int, int] = {}
    for i, text in enumerate(candidate):
        if text.strip() != target:
            continue
        score = 0
        for d in range(-_CONTEXT, _CONTEXT + 1):
            g, c = line - 1 + d, i + d
            if d and 0 <= g < len(generated) and 0 <= c < len(candidate):
                score += generated[g].strip() == candidate[c].strip()
        scores[i + 1] = score
    if not scores:
        return None
    best = max(scores.values())
    winners = [k for k, v in scores.items() if v == best]
    return winners[0] if len(winners) == 1 else None


def _resolve_generated(file: str, search_root: Path | None) -> Path | None:
    p = Path(file)
    if p.is_file():
        return p
    if search_root is not None and search_root.is_dir():
        hits = sorted(search_root.rglob(p.name))
        if hits:
            return hits[0]
    return None


def trace_to_candidate(
    messages: list[CompilerMessage], candidate_source: str, search_root: Path | None
) -> list[CompilerMessage]:
    """``messages`` with ``candidate_line`` filled in where the generated line can be traced."""
    cand_lines = candidate_source.splitlines()
    cache: dict[str, list[str]] = {}
    traced = []
    for m in messages:
        cand_line = m.candidate_line
        if cand_line is None and m.line is not None and m.file:
            gen = _resolve_generated(m.file, search_root)
            if gen is not None:
                if str(gen) not in cache:
                    cache[str(gen)] = gen.read_text(errors="replace").splitlines()
                cand_line = map_generated_line(cache[str(gen)], m.line, cand_lines)
        traced.append(CompilerMessage(m.file, m.line, m.column, m.severity, m.message, cand_line))
    return traced


def shape_log(messages: list[CompilerMessage], raw: str, candidate_source: str, name: str) -> str:
    """The log a reader sees: the first 10 errors, each at its candidate line with one line of
    context either side (an untraced one at its generated file's line), then the last 60
    lines of ``raw``."""
    cand_lines = candidate_source.splitlines()
    parts: list[str] = []
    errors = [m for m in messages if m.severity == "error"]
    for m in errors[:10]:
        where = Path(m.file).name if m.file else ""
        generated = where and where != name and m.line and m.candidate_line
        gen = f" ({where}:{m.line})" if generated else ""
        if m.candidate_line:
            parts.append(f"{name}:{m.candidate_line}: error: {m.message}{gen}")
            lo = max(1, m.candidate_line - 1)
            hi = min(len(cand_lines), m.candidate_line + 1)
            for i in range(lo, hi + 1):
                mark = ">" if i == m.candidate_line else " "
                parts.append(f"  {mark}{i:5d} | {cand_lines[i - 1]}")
        elif m.line:
            parts.append(f"{where}:{m.line}: error: {m.message}")
        else:
            parts.append(f"error: {m.message}")
    if len(errors) > 10:
        parts.append(f"... and {len(errors) - 10} more errors")
    tail = raw.strip().splitlines()[-_TAIL_LINES:]
    if tail:
        parts.append(f"--- compiler output (last {len(tail)} lines) ---")
        parts.extend(tail)
    return "\n".join(parts)
