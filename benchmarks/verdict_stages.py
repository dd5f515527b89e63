"""Where a warm verdict's time goes: every worker request, and the supervisor's own work.

Judges one candidate per problem (its fused CUDA example on a GPU, its C++ example on a CPU)
``--verdicts`` times with one judge (the first builds or fetches the build; the others are warm,
``--pause`` seconds apart, as an agent's calls are) and prints, for the warm verdicts, the median
seconds per verdict of each (worker role, request op) and of the supervisor's comparisons,
beside the verdict's own ``stage_s``.

Run:  PYTHONPATH=src python3 benchmarks/verdict_stages.py [--problems a,b] [--verdicts 4]
      [--pause 3] [--baselines eager] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

from verdict_latency import _candidate  # this script's folder is on sys.path

from kerneljudge import Judge, JudgeConfig
from kerneljudge.worker import process

_log: list[tuple[str, str, float]] = []
_lock = threading.Lock()


def _record(key: tuple[str, str], seconds: float) -> None:
    with _lock:
        _log.append((key[0], key[1], seconds))


def _instrument() -> None:
    """Wrap worker requests with a clock (the comparisons are the reference worker's
    ``compare`` requests)."""
    request = process.WorkerProcess.request

    def timed_request(self, op, timeout_s, **fields):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return request(self, op, timeout_s, **fields)
        finally:
            _record((self.role, op), time.perf_counter() - t0)

    process.WorkerProcess.request = timed_request  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="causal_gqa,mla_kv_projection,triangle_attention")
    ap.add_argument("--verdicts", type=int, default=4)
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--baselines", default="eager")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    _instrument()
    report = {}
    for name in args.problems.split(","):
        cand = _candidate(name)
        config = JudgeConfig(baselines=tuple(args.baselines.split(",")))
        per_verdict: list[dict[str, float]] = []
        stages: list[dict[str, float]] = []
        with Judge(name, config) as judge:
            for i in range(args.verdicts):
                if i:
                    time.sleep(args.pause)
                with _lock:
                    _log.clear()
                t0 = time.perf_counter()
                verdict = judge.evaluate(cand)
                total = time.perf_counter() - t0
                with _lock:
                    sums: dict[str, float] = defaultdict(float)
                    for role, op, s in _log:
                        sums[f"{role}.{op}"] += s
                sums["total"] = total
                per_verdict.append(dict(sums))
                stages.append(dict(verdict.stage_s))
                print(f"{name} verdict {i}: {verdict.status.value} in {total:.2f} s", flush=True)
        warm = per_verdict[1:] or per_verdict
        keys = sorted(
            {k for d in warm for k in d},
            key=lambda k: -statistics.median([d.get(k, 0.0) for d in warm]),
        )
        print(f"{name}: median s per warm verdict (requests overlap: the reference's run beside")
        print("  the build on its preparation thread)")
        for k in keys:
            print(f"  {k:<32} {statistics.median([d.get(k, 0.0) for d in warm]):8.3f}")
        wst = stages[1:] or stages
        print(
            "  stage_s: "
            + ", ".join(
                f"{k} {statistics.median([s.get(k, 0.0) for s in wst]):.2f}" for k in wst[0]
            )
        )
        report[name] = {"requests": per_verdict, "stage_s": stages}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
