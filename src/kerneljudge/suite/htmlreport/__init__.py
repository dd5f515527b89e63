"""The HTML report of a suite run, or of two runs compared: one self-contained file.

The page (``kerneljudge report RUN [--compare RUN2]``) holds the runs' summaries; five plots
drawn with matplotlib and embedded as base64 PNG (speedup distribution, fast_p over p with its
ties band, per-candidate speedups with 95% intervals, the roofline, statuses); the metrics
tables of :mod:`kerneljudge.suite.metrics` for the whole run, per level and per tag; with two
runs a per-problem comparison; and one section per candidate (verdict, source, episode
transcript) that the candidate index links to. It loads nothing from the network and runs no
script. Needs matplotlib: ``pip install 'kerneljudge[report]'``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from kerneljudge.errors import KernelJudgeError
from kerneljudge.suite.store import ResultsStore

__all__ = ["ReportError", "default_report_path", "render_report", "write_report"]


class ReportError(KernelJudgeError):
    """The report cannot be made: matplotlib is missing, or the file cannot be written."""


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError(
            "the HTML report needs matplotlib: pip install 'kerneljudge[report]'"
        ) from None


def render_report(store: ResultsStore, run: str, compare: str | None = None) -> str:
    """The report page of run ``run`` (and ``compare`` beside it), as HTML text.

    Args:
        store: the results store holding the runs.
        run, compare: run ids, unique prefixes of one, or ``latest``.

    Raises:
        ReportError: matplotlib is not installed.
        StoreError: a run is not in the store, or a prefix matches several.
    """
    _need_matplotlib()
    from kerneljudge.suite.htmlreport.data import load_run
    from kerneljudge.suite.htmlreport.page import render_page
    from kerneljudge.suite.htmlreport.plots import all_plots

    runs = [load_run(store, run, "run1")]
    if compare is not None:
        runs.append(load_run(store, compare, "run2"))
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    return render_page(runs, all_plots(runs), generated)


def default_report_path(run_id: str, compare_id: str | None = None) -> Path:
    """``report-<run>.html``, or ``report-<run>-vs-<run2>.html``, in the working folder."""
    name = run_id if compare_id is None else f"{run_id}-vs-{compare_id}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Path(f"report-{safe}.html")


def write_report(
    store: ResultsStore, run: str, compare: str | None = None, out: Path | None = None
) -> Path:
    """Write the report page (see :func:`render_report`) to ``out`` (default
    :func:`default_report_path`) and return its path.

    Raises:
        ReportError: matplotlib is missing, or ``out`` cannot be written.
        StoreError: as :func:`render_report`.
    """
    text = render_report(store, run, compare)
    if out is None:
        out = default_report_path(
            store.resolve(run), store.resolve(compare) if compare is not None else None
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out
