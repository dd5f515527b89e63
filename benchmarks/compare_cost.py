"""Seconds to compare one output with the reference and its float64 oracle
(:func:`kerneljudge.check.compare_outputs`), on the CPU and, where a GPU is visible, on it.

For each size (fp32 elements, doubling from ``--min-mib`` to ``--max-mib`` MiB of output) the
reference, an honest candidate (the reference plus noise far below the tolerance) and the
float64 oracle are made on the CPU, as the reference worker holds them; the comparison then runs
with ``device="cpu"`` and with ``device="cuda"`` (the reference worker's on a GPU), one right
after the other, ``--repeats`` times each; the median seconds of each and their ratio are printed
(and written to ``--json``). With ``--chunks A,B,...`` the CPU comparison runs once with each
of those chunk sizes instead (:data:`kerneljudge.check.CHUNK`, elements), alternating, and each
one's median is printed beside the first one's.

Run:  PYTHONPATH=src python3 benchmarks/compare_cost.py [--min-mib 1] [--max-mib 256]
      [--repeats 3] [--chunks 16384,31744] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import torch

import kerneljudge.check as check
from kerneljudge.check import compare_outputs


def _seconds(ref: torch.Tensor, cand: torch.Tensor, oracle: torch.Tensor, device: str) -> float:
    t0 = time.perf_counter()
    result = compare_outputs(ref, cand, oracle=oracle, atol=1e-4, rtol=1e-4, device=device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not result.passed:
        raise SystemExit(f"the honest candidate failed: {result.reason}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--chunks", default="", help="CPU chunk sizes to compare (elements)")
    args = parser.parse_args()
    if args.chunks:
        _chunks(args)
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    ways = {d: functools.partial(_seconds, device=d) for d in devices}
    for mib, row in _medians(args, ways):
        ratio = row["cpu"] / row["cuda"] if "cuda" in row else None
        rows.append({"mib": mib, **row, "cpu_over_cuda": ratio})
        extra = f"  cuda {row['cuda']:.4f} s  cpu/cuda {ratio:.1f}" if ratio else ""
        print(f"{mib:6d} MiB  cpu {row['cpu']:.4f} s{extra}", flush=True)
    _write(args.json, rows)


Way = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float]


def _medians(
    args: argparse.Namespace, ways: dict[str, Way]
) -> Iterator[tuple[int, dict[str, float]]]:
    """For each size from ``args.min_mib`` to ``args.max_mib`` MiB (doubling): the median
    seconds of each of ``ways`` over ``args.repeats`` rounds, the ways alternating."""
    mib = args.min_mib
    while mib <= args.max_mib:
        ref, cand, oracle = _inputs(mib)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, way in ways.items():  # side by side, alternating
                times[name].append(way(ref, cand, oracle))
        del ref, cand, oracle
        yield mib, {name: statistics.median(t) for name, t in times.items()}
        mib *= 2


def _inputs(mib: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reference, honest candidate, float64 oracle) of ``mib`` MiB of float32 output."""
    n = mib * (1 << 20) // 4
    g = torch.Generator().manual_seed(mib)
    oracle = torch.randn(n, generator=g, dtype=torch.float64)
    return (
        oracle.float(),
        (oracle + 1e-9 * torch.randn(n, generator=g, dtype=torch.float64)).float(),
        oracle,
    )


def _chunks(args: argparse.Namespace) -> None:
    """The CPU comparison's median seconds with each of ``args.chunks``, alternating."""
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = []
    ways = {str(c): functools.partial(_chunked, c) for c in chunks}
    for mib, row in _medians(args, ways):
        rows.append({"mib": mib, **row})
        first = row[str(chunks[0])]
        cells = "  ".join(f"{c}: {row[str(c)]:.4f} s ({row[str(c)] / first:.2f})" for c in chunks)
        print(f"{mib:6d} MiB  {cells}", flush=True)
    _write(args.json, rows)


def _chunked(chunk: int, ref: torch.Tensor, cand: torch.Tensor, oracle: torch.Tensor) -> float:
    check.CHUNK = chunk
    return _seconds(ref, cand, oracle, "cpu")


def _write(path: Path | None, rows: list[dict[str, float | None]]) -> None:
    if path:
        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        }
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
