"""Small HTML helpers of the report: escaping, tables, status badges, speedup text."""

from __future__ import annotations

import html
from collections.abc import Collection, Sequence
from typing import Any

from kerneljudge.suite.store import StoredVerdict

__all__ = ["esc", "speedup_text", "status_badge", "table"]

_STATUSES = {"correct", "incorrect", "rejected", "compile_error", "runtime_error", "timeout"}


def esc(value: Any) -> str:
    """``value`` as text with ``& < > " '`` escaped, for element content and attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def status_badge(status: str) -> str:
    """The status in a coloured span (the class only for known statuses)."""
    cls = f"st-{status}" if status in _STATUSES else "st-other"
    return f'<span class="st {cls}">{esc(status)}</span>'


def speedup_text(row: StoredVerdict | None) -> tuple[str, str]:
    """``("1.23x", "1.10-1.40")`` for a timed row, ``("-", "-")`` otherwise."""
    if row is None or row.speedup is None:
        return "-", "-"
    ci = "-"
    if row.speedup_lo is not None and row.speedup_hi is not None:
        ci = f"{row.speedup_lo:.3g}-{row.speedup_hi:.3g}"
    return f"{row.speedup:.3g}x", ci


def table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int] = ()) -> str:
    """An HTML table; ``head`` is escaped here, the cells must already be HTML."""
    out = ["<table><thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        cells = [
            f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def kv_table(items: Sequence[tuple[str, str]]) -> str:
    """A two-column table of (name, HTML value) rows; names are escaped here."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def pre(text: Any) -> str:
    """``text`` escaped in a ``<pre>`` block."""
    return f"<pre>{esc(text)}</pre>"
