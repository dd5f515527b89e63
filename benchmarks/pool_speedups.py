"""Median speedup over eager per problem, pooled over the rows of ``verdict_latency.py`` JSONs,
against reference figures (the judge's earlier measurements, or any others).

Run:  python3 benchmarks/pool_speedups.py RUN.json [RUN.json ...]
      [--against causal_gqa=204.8,mla_kv_projection=2.64,triangle_attention=2.31]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument(
        "--against", default="causal_gqa=204.8,mla_kv_projection=2.64,triangle_attention=2.31"
    )
    args = ap.parse_args()
    against = {k: float(v) for k, v in (x.split("=") for x in args.against.split(",") if x)}
    pooled: dict[str, list[float]] = {}
    for path in args.runs:
        for row in json.loads(path.read_text())["rows"]:
            pooled.setdefault(row["problem"], []).extend(row["speedups_vs_eager"])
    print(f"{'problem':<22}{'verdicts':>9}{'median':>10}{'min':>9}{'max':>9}{'vs ref':>9}")
    for name, speedups in pooled.items():
        med = statistics.median(speedups)
        ref = against.get(name)
        rel = f"{100 * (med / ref - 1):+.1f}%" if ref else "-"
        print(
            f"{name:<22}{len(speedups):>9}{med:>10.4g}{min(speedups):>9.3g}"
            f"{max(speedups):>9.3g}{rel:>9}"
        )


if __name__ == "__main__":
    main()
