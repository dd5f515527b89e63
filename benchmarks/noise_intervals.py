"""Coverage of the speedup interval of an honest candidate on a loaded CPU host.

The candidate is the reference itself (the problem's ``Model`` renamed ``ModelNew``), so its
true speedup over eager is 1, up to what the candidate's sandboxed worker adds to each call.
Spinner processes (``--spinners-per-cpu`` per CPU this process may use, each a
``while True: pass`` interpreter) load the host while one judge gives ``--verdicts`` verdicts
in a row (on the CPU, or ``--device cuda``). Each verdict's line: status, speedup over eager,
its 95% interval, whether the interval holds 1, whether the verdict flagged the host noisy (and
why), its timing passes and the threads/cores it timed on. The summary: how many intervals
held 1, how many verdicts were flagged, and how many did neither (a tight interval that
excludes the truth: the failure this measures).

Problems: ``tiny`` (``tests/fixtures/tiny_problem.py``, about 10 us a call) and ``linear_gelu``
(``benchmarks/problems/cpu_linear_gelu.py``, a 256x512x512 Linear that torch's intra-op threads
split), or any problem file path.

Run:  PYTHONPATH=src python3 benchmarks/noise_intervals.py [--problems tiny,linear_gelu]
      [--verdicts 10] [--spinners-per-cpu 2] [--max-time 1] [--device cpu] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kerneljudge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = {
    "tiny": ROOT / "tests" / "fixtures" / "tiny_problem.py",
    "linear_gelu": ROOT / "benchmarks" / "problems" / "cpu_linear_gelu.py",
}


def identity_candidate(problem: Path, folder: Path) -> Path:
    """A candidate file that is ``problem``'s source with ``class Model`` renamed ``ModelNew``."""
    source, count = re.subn(r"^class Model\b", "class ModelNew", problem.read_text(), flags=re.M)
    if count != 1:
        raise SystemExit(f"{problem}: expected one 'class Model', found {count}")
    path = folder / f"identity_{problem.stem}.py"
    path.write_text(source)
    return path


def start_spinners(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy-looping interpreters (the caller kills them)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]


def stop_spinners(spinners: list[subprocess.Popen[bytes]]) -> None:
    for p in spinners:
        p.kill()
    for p in spinners:
        p.wait()


def verdict_row(v: Any) -> dict[str, Any]:
    """The fields of one verdict this benchmark reports (older verdicts lack ``host``)."""
    row: dict[str, Any] = {"status": v.status.value, "reason": v.reason}
    timing = v.timing
    sp = timing.speedup("eager") if timing else None
    if sp is None:
        return row
    host = getattr(timing, "host", None)
    row.update(
        speedup=sp.median,
        ci95=list(sp.ci95),
        covers_1=sp.ci95[0] <= 1.0 <= sp.ci95[1],
        noisy=bool(host and host.noisy),
        reasons=list(host.noise_reasons) if host else [],
        passes=getattr(timing, "passes", 1),
        threads=getattr(timing, "threads", 0),
        cores=list(getattr(timing, "cores", ())),
        rounds=timing.rounds,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="tiny,linear_gelu")
    ap.add_argument("--verdicts", type=int, default=10)
    ap.add_argument("--spinners-per-cpu", type=float, default=2.0)
    ap.add_argument("--max-time", type=float, default=1.0, help="TimingConfig.max_time_s")
    ap.add_argument("--device", default="cpu", help="JudgeConfig.device (cpu, cuda)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    n_spin = int(round(args.spinners_per_cpu * cpus))
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {cpus} CPUs",
        "spinners": n_spin,
        "problems": {},
    }
    report["device"] = args.device
    print(
        f"{report['machine']}; device {args.device}; {n_spin} spinners; "
        f"{args.verdicts} verdicts per problem"
    )
    with tempfile.TemporaryDirectory(prefix="kj-noise-") as tmp:
        for name in args.problems.split(","):
            problem = PROBLEMS.get(name, Path(name))
            candidate = identity_candidate(problem, Path(tmp))
            config = JudgeConfig(
                device=args.device,
                baselines=("eager",),
                cache_dir=Path(tmp) / "cache",
                timing_config=TimingConfig(max_time_s=args.max_time),
            )
            rows = []
            with Judge(problem, config) as judge:
                judge.evaluate(candidate)  # warm: workers started, build cached, not counted
                spinners = start_spinners(n_spin)
                try:
                    time.sleep(1.0)
                    for i in range(args.verdicts):
                        load = _loadavg()
                        t0 = time.perf_counter()
                        row = verdict_row(judge.evaluate(candidate))
                        row["seconds"] = time.perf_counter() - t0
                        row["loadavg"] = load
                        rows.append(row)
                        print(f"{name} #{i}: {_line(row)}", flush=True)
                finally:
                    stop_spinners(spinners)
            timed = [r for r in rows if "speedup" in r]
            covered = sum(r["covers_1"] for r in timed)
            flagged = sum(r["noisy"] for r in timed)
            failed = sum(not r["covers_1"] and not r["noisy"] for r in timed)
            summary = {
                "verdicts": len(rows),
                "timed": len(timed),
                "covers_1": covered,
                "noisy": flagged,
                "neither": failed,
                "speedups": [round(r["speedup"], 3) for r in timed],
            }
            report["problems"][name] = {"rows": rows, "summary": summary}
            print(
                f"{name}: {covered}/{len(timed)} intervals hold 1, {flagged} flagged noisy, "
                f"{failed} neither; speedups {summary['speedups']}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _loadavg() -> str:
    """``/proc/loadavg``'s first four fields (1, 5, 15 min load; runnable/total tasks)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:4])
    except OSError:
        return ""


def _line(row: dict[str, Any]) -> str:
    if "speedup" not in row:
        return f"{row['status']} {row['reason']}"
    lo, hi = row["ci95"]
    flag = f" NOISY ({'; '.join(row['reasons'])})" if row["noisy"] else ""
    return (
        f"{row['status']} {row['speedup']:.3f}x [{lo:.3f}, {hi:.3f}] "
        f"{'holds 1' if row['covers_1'] else 'EXCLUDES 1'}, {row['passes']} pass(es), "
        f"{row['rounds']} rounds, {row['threads']} threads on cores {row['cores']}, "
        f"{row['seconds']:.1f} s, loadavg {row['loadavg']}{flag}"
    )


if __name__ == "__main__":
    main()
