"""How often the timer audit catches the CPU timer cheats on a loaded host, and how often it
passes the honest candidate there: each candidate judged ``--times`` times while
``tests/load/loadgen.py``'s load runs (2 x cores busy loops, a memory-bandwidth hog, and a
verdict loop of its own beside).

The candidates are the adversarial suite's (``tests/adversarial/cpu``) on its CPU problem,
judged by one warm judge with the load test's configuration (eager baseline only, two trials,
a 0.3 s timing budget). Per candidate it prints how many verdicts were of each status, how
many were accepted after an inconclusive timer audit (``timer_note``), and the eager speedups'
range; per verdict, one line as it finishes.

Run:  PYTHONPATH=src python3 benchmarks/timer_cheats_under_load.py [--times 6] [--quiet-host]
      [--json OUT] [NAME ...]   (NAME: a file name in tests/adversarial/cpu, without .py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ADV = REPO / "tests" / "adversarial"
sys.path.insert(0, str(REPO / "tests" / "load"))

from loadgen import Load, load_tier_config  # noqa: E402

from kerneljudge.judge import Judge  # noqa: E402

DEFAULT = [
    "correct_baseline",
    "cheat_precompute_between_calls",
    "cheat_timer_patch_worker",
    "cheat_patch_op_time",
    "cheat_timer_patch_torch",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=DEFAULT)
    parser.add_argument("--times", type=int, default=6)
    parser.add_argument("--quiet-host", action="store_true", help="no load (for comparison)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    problem = str(ADV / "problem_cpu.py")
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_tier_config(Path(tmp) / "cache")
        judge = Judge(problem, cfg)
        beside = (problem, str(ADV / "cpu" / "correct_baseline.py"))
        load: Any = contextlib.nullcontext()
        if not args.quiet_host:
            load = Load(3600.0, beside=beside, beside_config=cfg)
        started = time.time()
        try:
            with load:
                for name in args.names:
                    for i in range(args.times):
                        v = judge.evaluate(ADV / "cpu" / f"{name}.py")
                        sp = v.timing.speedup("eager") if v.timing is not None else None
                        note = v.timing.timer_note if v.timing is not None else ""
                        row = {
                            "status": v.status.value,
                            "speedup": sp.median if sp else None,
                            "timer_note": note,
                            "reason": v.reason[:200],
                            "seconds": round(v.duration_s, 1),
                        }
                        rows.setdefault(name, []).append(row)
                        speed = f"{sp.median:.3g}x" if sp else "-"
                        print(f"{name} #{i}: {v.status.value} {speed} ({v.duration_s:.1f} s) "
                              f"{(note or v.reason)[:120]}", flush=True)  # fmt: skip
        finally:
            judge.close()
    print(f"\n{'quiet' if args.quiet_host else 'loaded'} host, {time.time() - started:.0f} s")
    print(f"{'candidate':34} {'verdicts':24} {'accepted inconclusive':>22} {'eager speedups':>18}")
    for name, rs in rows.items():
        counts = ", ".join(f"{k} {n}" for k, n in sorted(Counter(r["status"] for r in rs).items()))
        notes = sum(bool(r["timer_note"]) and r["status"] == "correct" for r in rs)
        sps = [r["speedup"] for r in rs if r["speedup"] is not None]
        span = f"{min(sps):.3g}-{max(sps):.3g}" if sps else "-"
        print(f"{name:34} {counts:24} {notes:>22} {span:>18}")
    if args.json is not None:
        args.json.write_text(json.dumps({"loaded": not args.quiet_host, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
