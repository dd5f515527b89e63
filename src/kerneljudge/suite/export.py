"""Exports of a run's verdicts: JSON lines (standard library) and Parquet (pyarrow, optional).

One record per stored verdict: the run's id, model, sampling parameters and metadata, the
problem (name, level, tags), the sample id, the candidate (path, SHA-256, source), the status,
the eager speedup with its 95% interval, the device and versions, timestamps, the full verdict
and the episode transcript (None unless the verdict came from an episode).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kerneljudge.errors import KernelJudgeError
from kerneljudge.suite.store import ResultsStore

__all__ = ["export_jsonl", "export_parquet", "records"]


def records(store: ResultsStore, run_id: str) -> Iterator[dict[str, Any]]:
    """The export records of run ``run_id`` (JSON-ready dicts), in storage order."""
    info = store.run(run_id)
    for v in store.verdicts(info.run_id):
        row = v.to_dict()
        row.update(model=info.model, sampling=info.sampling, metadata=info.metadata)
        yield row


def _writable(output: Path) -> None:
    """Make ``output``'s folder where it is missing.

    Raises:
        KernelJudgeError: the folder cannot be made.
    """
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelJudgeError(f"cannot write {output}: {exc.strerror or exc}") from None


def export_jsonl(store: ResultsStore, run_id: str, output: Path | None) -> int:
    """Write one JSON object per line to ``output`` (None: stdout; a file's missing folders
    are made); return the count.

    Raises:
        KernelJudgeError: ``output`` cannot be written.
    """
    out = sys.stdout
    if output is not None:
        _writable(output)
        try:
            out = output.open("w", encoding="utf-8")
        except OSError as exc:
            raise KernelJudgeError(f"cannot write {output}: {exc.strerror or exc}") from None
    n = 0
    try:
        for row in records(store, run_id):
            out.write(json.dumps(row) + "\n")
            n += 1
    finally:
        if output:
            out.close()
    return n


def export_parquet(store: ResultsStore, run_id: str, output: Path) -> int:
    """Write a Parquet file, one row per verdict; nested fields (``verdict``, ``sampling``,
    ``metadata``, ``versions``, ``transcript``) as JSON text columns (the file's missing
    folders are made); return the count.

    Raises:
        KernelJudgeError: pyarrow is not installed (the ``kerneljudge[parquet]`` extra), or
            ``output`` cannot be written.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise KernelJudgeError(
            "parquet export needs pyarrow: pip install 'kerneljudge[parquet]'"
        ) from None
    nested = ("verdict", "sampling", "metadata", "versions", "transcript", "tags")
    rows = []
    for row in records(store, run_id):
        for key in nested:
            row[key] = json.dumps(row[key]) if row[key] is not None else None
        rows.append(row)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("run_id", pa.string()),
            ("problem", pa.string()),
            ("level", pa.int64()),
            ("tags", pa.string()),
            ("sample", pa.string()),
            ("candidate_path", pa.string()),
            ("candidate_source", pa.string()),
            ("candidate_sha256", pa.string()),
            ("backend", pa.string()),
            ("status", pa.string()),
            ("device", pa.string()),
            ("versions", pa.string()),
            ("started_at", pa.string()),
            ("finished_at", pa.string()),
            ("stored_at", pa.string()),
            ("speedup", pa.float64()),
            ("speedup_lo", pa.float64()),
            ("speedup_hi", pa.float64()),
            ("transcript", pa.string()),
            ("verdict", pa.string()),
            ("model", pa.string()),
            ("sampling", pa.string()),
            ("metadata", pa.string()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    _writable(output)
    try:
        pq.write_table(table, output)
    except OSError as exc:
        raise KernelJudgeError(f"cannot write {output}: {exc.strerror or exc}") from None
    return len(rows)
