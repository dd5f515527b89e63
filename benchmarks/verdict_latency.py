"""Time to verdict, cold and warm, and the spread of repeated verdicts of one candidate.

For each problem (its fused CUDA example on a GPU, its C++ example on a CPU):

* cold: an empty build cache and a new judge (build + worker start + check + timing);
* warm, new judge: the build cached, everything else new (a second ``kerneljudge eval``);
* warm, same judge: the build cached and the judge's workers alive (an agent's next tool call,
  which comes ``--pause`` seconds after the last verdict: the time its model takes to reply);
* ``--repeats`` verdicts from that same judge (the first is the warm one): the spread of their
  speedups over eager, as the largest deviation from their mean (``+-``, the target's form) and
  as ``(max - min) / mean``; each verdict's eager and candidate medians are kept, to tell which
  side moved.

``--max-time 2,1.5`` compares timing budgets (``TimingConfig.max_time_s``) side by side: the
repeated verdicts take each budget in turn, one row per budget.

``--separate N`` measures instead what a user sees from the command line: N verdicts of each
problem's candidate, each from a fresh ``kerneljudge eval --json`` process (the first one builds
into the run's cache), ``--pause`` seconds apart. Per problem it prints each verdict's launched
speedup over eager with its 95% interval and its graph-replay speedup, and checks the two
targets on the N: every replay speedup within 2% of the N replays' median; every launched
verdict's interval holding the N launched speedups' median, or else the verdict saying it moves
with the host (``timing.graph.note``) with its host range (``timing.graph.host_range``) holding
that median.

Run:  PYTHONPATH=src python3 benchmarks/verdict_latency.py [--problems a,b] [--json OUT]
      [--baselines eager,compile] [--repeats 5] [--pause 3] [--parallel-cold]
      [--max-time 2,1.5]
      PYTHONPATH=src python3 benchmarks/verdict_latency.py --separate 10 --pause 5 --json OUT
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import torch

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.timing import TimingConfig
from kerneljudge.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]


def _cpu_ticks() -> tuple[int, int]:
    """(steal, total) clock ticks of all CPUs so far, from ``/proc/stat`` ((0, 0) elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def _timed(judge: Judge, candidate: Path) -> tuple[float, Verdict]:
    t0 = time.perf_counter()
    verdict = judge.evaluate(candidate)
    return time.perf_counter() - t0, verdict


def _timed_with_steal(judge: Judge, candidate: Path) -> tuple[float, Verdict, float]:
    """As :func:`_timed`, plus the share of CPU time the hypervisor gave to others meanwhile
    (``steal`` in ``/proc/stat``): a host busy with other machines slows launch-bound timings."""
    steal0, total0 = _cpu_ticks()
    elapsed, verdict = _timed(judge, candidate)
    steal1, total1 = _cpu_ticks()
    return elapsed, verdict, (steal1 - steal0) / max(1, total1 - total0)


def _speedup(v: Verdict) -> float | None:
    s = v.timing.speedup("eager") if v.timing else None
    return s.median if s else None


def _candidate(problem: str) -> Path:
    gpu = torch.cuda.is_available()
    return ROOT / "examples" / problem / ("cuda_fused.py" if gpu else "cpp_reference.py")


def cold(problem: str, baselines: tuple[str, ...], cache_root: Path) -> tuple[float, Verdict]:
    """One verdict from an empty build cache and a new judge."""
    cache = cache_root / problem
    shutil.rmtree(cache, ignore_errors=True)
    with Judge(problem, JudgeConfig(cache_dir=cache, baselines=baselines)) as judge:
        return _timed(judge, _candidate(problem))


def _median_of(v: Verdict, name: str) -> dict[str, object] | None:
    m = v.timing.measurement(name) if v.timing else None
    return (
        None if m is None else {"median_ms": m.median_ms, "ci95": list(m.ci95_ms), "n": m.samples}
    )


def warm(
    problem: str,
    baselines: tuple[str, ...],
    cache_root: Path,
    cold_s: float,
    cold: Verdict,
    repeats: int,
    pause_s: float,
    max_times: list[float],
) -> list[dict[str, object]]:
    """Verdicts with the build cached: from a new judge, then ``repeats`` from one live judge
    for each timing budget in ``max_times`` (seconds), the budgets taken in turn."""
    candidate = _candidate(problem)
    if cold.status is not Status.CORRECT:
        raise SystemExit(f"{problem}: {candidate.name} is {cold.status.value}: {cold.reason}")
    config = JudgeConfig(cache_dir=cache_root / problem, baselines=baselines)
    runs: list[list[tuple[float, Verdict, float]]] = [[] for _ in max_times]
    with Judge(problem, config) as judge:
        warm_new_s, _ = _timed(judge, candidate)
        for _ in range(repeats):
            for i, max_time in enumerate(max_times):
                time.sleep(pause_s)
                with judge.configured(timing_config=TimingConfig(max_time_s=max_time)):
                    runs[i].append(_timed_with_steal(judge, candidate))
    rows = []
    for i, max_time in enumerate(max_times):
        verdicts = [v for _, v, _ in runs[i]]
        for v in verdicts:
            if v.status is not Status.CORRECT:
                raise SystemExit(f"{problem}: a repeated verdict is {v.status.value}: {v.reason}")
        speedups = [s for s in map(_speedup, verdicts) if s is not None]
        mean = sum(speedups) / len(speedups)
        rows.append(
            {
                "problem": problem,
                "candidate": candidate.name,
                "max_time_s": max_time,
                "cold_s": cold_s,
                "build_s": cold.build.duration_s if cold.build else None,
                "warm_new_judge_s": warm_new_s,
                "warm_same_judge_s": runs[i][0][0],
                "warm_same_judge_all_s": [t for t, _, _ in runs[i]],
                "speedups_vs_eager": speedups,
                "speedup_max_deviation": max(abs(s / mean - 1) for s in speedups),
                "speedup_spread": (max(speedups) - min(speedups)) / mean,
                "eager": [_median_of(v, "eager") for v in verdicts],
                "candidate_times": [_median_of(v, "candidate") for v in verdicts],
                "rounds": [v.timing.rounds if v.timing else None for v in verdicts],
                "started_at": [v.started_at for v in verdicts],
                "cpu_steal_share": [stolen for _, _, stolen in runs[i]],
                "compile_baseline": [_speedup_of(v, "compile") for v in verdicts],
                "stage_s": [v.stage_s for v in verdicts],
            }
        )
    return rows


def _speedup_of(v: Verdict, baseline: str) -> float | None:
    s = v.timing.speedup(baseline) if v.timing else None
    return s.median if s else None


def _eval_process(problem: str, cache: Path, baselines: tuple[str, ...]) -> tuple[float, dict]:
    """One verdict from a fresh ``kerneljudge eval --json --local`` process: (seconds, JSON)."""
    cmd = [sys.executable, "-m", "kerneljudge", "eval", str(_candidate(problem)), "-p", problem]
    cmd += ["--json", "--local", "--cache-dir", str(cache), "--baselines", ",".join(baselines)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    try:
        return elapsed, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{problem}: eval gave no verdict: {done.stderr[-2000:]}") from None


def _within(x: float, interval: list[float] | tuple[float, float] | None) -> bool:
    return interval is not None and interval[0] <= x <= interval[1]


def separate(
    problem: str, n: int, pause_s: float, cache_root: Path, baselines: tuple[str, ...]
) -> dict[str, object]:
    """``n`` verdicts from fresh processes, ``pause_s`` apart, and the two targets' checks."""
    rows = []
    for i in range(n):
        if i:
            time.sleep(pause_s)
        elapsed, v = _eval_process(problem, cache_root / problem, baselines)
        timing = v.get("timing") or {}
        graph = timing.get("graph") or {}
        launched = next((s for s in timing.get("speedups", []) if s["baseline"] == "eager"), None)
        replay = next((s for s in graph.get("speedups", []) if s["baseline"] == "eager"), None)
        rows.append(
            {
                "seconds": elapsed,
                "status": v.get("status"),
                "launched": launched["median"] if launched else None,
                "launched_ci95": launched["ci95"] if launched else None,
                "replay": replay["median"] if replay else None,
                "replay_ci95": replay["ci95"] if replay else None,
                "host_range": (graph.get("host_range") or {}).get("eager"),
                "host_share": graph.get("host_share"),
                "note": graph.get("note", ""),
                "not_captured": graph.get("not_captured"),
                "started_at": v.get("started_at"),
                "stage_s": v.get("stage_s"),
                "capture_s": graph.get("capture_s"),
                "graph_s": graph.get("seconds"),
            }
        )
        r = rows[-1]
        print(
            f"  {problem} {i + 1}/{n}: {r['status']} launched {r['launched']} "
            f"{r['launched_ci95']} replay {r['replay']} host range {r['host_range']} "
            f"({elapsed:.1f} s; stages {r['stage_s']})",
            flush=True,
        )
    launched_all = [r["launched"] for r in rows if r["launched"] is not None]
    replays = [r["replay"] for r in rows if r["replay"] is not None]
    med_l = statistics.median(launched_all) if launched_all else math.nan
    med_r = statistics.median(replays) if replays else math.nan
    holds = [
        _within(med_l, r["launched_ci95"]) or (bool(r["note"]) and _within(med_l, r["host_range"]))
        for r in rows
    ]
    return {
        "problem": problem,
        "candidate": _candidate(problem).name,
        "verdicts": rows,
        "launched_median": med_l,
        "launched_max_deviation": max((abs(x / med_l - 1) for x in launched_all), default=None),
        "intervals_holding_median": sum(_within(med_l, r["launched_ci95"]) for r in rows),
        "holding_or_said_host_bound": sum(holds),
        "replay_median": med_r,
        "replay_max_deviation": max((abs(x / med_r - 1) for x in replays), default=None),
        "replays": len(replays),
    }


def main_separate(args: argparse.Namespace) -> None:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
    cache_root = Path(tempfile.mkdtemp(prefix="kj-latency-"))
    baselines = ("eager",)
    out: dict[str, object] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "separate": args.separate,
        "pause_s": args.pause,
        "problems": [],
    }
    for problem in args.problems.split(","):
        row = separate(problem, args.separate, args.pause, cache_root, baselines)
        out["problems"].append(row)  # type: ignore[attr-defined]
        dev_r = row["replay_max_deviation"]
        print(
            f"{problem}: launched median {row['launched_median']:.4g}, max deviation "
            f"{(row['launched_max_deviation'] or 0) * 100:.1f}%, intervals holding it "
            f"{row['intervals_holding_median']}/{args.separate}, holding or host-bound said "
            f"{row['holding_or_said_host_bound']}/{args.separate}; replay median "
            f"{row['replay_median']:.4g} over {row['replays']}, max deviation "
            f"{'-' if dev_r is None else format(dev_r * 100, '.2f')}%",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))
    shutil.rmtree(cache_root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="causal_gqa,mla_kv_projection,triangle_attention")
    parser.add_argument("--baselines", default="eager,compile")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5, help="verdicts from one live judge")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between those verdicts")
    parser.add_argument(
        "--parallel-cold", action="store_true", help="run the cold verdicts of all problems at once"
    )
    parser.add_argument(
        "--max-time",
        default="",
        help="timing budgets (s) to compare, comma-separated (default: TimingConfig's)",
    )
    parser.add_argument(
        "--separate", type=int, default=0, help="N verdicts from fresh eval processes instead"
    )
    args = parser.parse_args()
    if args.separate:
        main_separate(args)
        return
    max_times = [float(x) for x in args.max_time.split(",") if x] or [TimingConfig().max_time_s]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
    cache_root = Path(tempfile.mkdtemp(prefix="kj-latency-"))
    problems = args.problems.split(",")
    baselines = tuple(args.baselines.split(","))
    # Cold verdicts of the problems run at once (each builds in its own processes); the warm
    # verdicts, whose timings give the spread, run one problem at a time on a quiet device.
    with ThreadPoolExecutor(max_workers=len(problems) if args.parallel_cold else 1) as pool:
        colds = list(pool.map(lambda p: cold(p, baselines, cache_root), problems))
    rows = [
        row
        for p, c in zip(problems, colds)
        for row in warm(p, baselines, cache_root, *c, args.repeats, args.pause, max_times)
    ]
    shutil.rmtree(cache_root, ignore_errors=True)
    print(
        f"device: {device}   torch {torch.__version__}   baselines: {args.baselines}   "
        f"cold verdicts {'in parallel' if args.parallel_cold else 'one at a time'}"
    )
    print(
        f"{'problem':<20}{'max s':>6}{'cold s':>8}{'build s':>9}{'warm new s':>12}"
        f"{'warm same s':>13}{'max dev':>9}{'range':>8}   speedups vs eager"
    )
    for r in rows:
        sp = ", ".join(f"{s:.3g}" for s in r["speedups_vs_eager"])  # type: ignore[union-attr]
        print(
            f"{r['problem']:<20}{r['max_time_s']:>6.2g}{r['cold_s']:>8.1f}{r['build_s']:>9.1f}"
            f"{r['warm_new_judge_s']:>12.2f}{r['warm_same_judge_s']:>13.2f}"
            f"{r['speedup_max_deviation'] * 100:>8.2f}%{r['speedup_spread'] * 100:>7.1f}%   {sp}"
        )
        eager = ", ".join(f"{e['median_ms']:.4g}" for e in r["eager"] if e)  # type: ignore[union-attr]
        cand = ", ".join(f"{c['median_ms']:.4g}" for c in r["candidate_times"] if c)  # type: ignore[union-attr]
        print(f"{'':<20}eager ms: {eager}   candidate ms: {cand}")
        stages = r["stage_s"]  # type: ignore[assignment]
        names = list(dict.fromkeys(k for st in stages for k in st))  # type: ignore[union-attr]
        medians = {
            k: statistics.median(st.get(k, 0.0) for st in stages)  # type: ignore[union-attr]
            for k in names
        }
        print(
            f"{'':<20}warm same, median s per stage: "
            + ", ".join(f"{k} {v:.2f}" for k, v in medians.items())
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "device": device,
                    "torch": torch.__version__,
                    "baselines": args.baselines,
                    "parallel_cold": args.parallel_cold,
                    "repeats": args.repeats,
                    "pause_s": args.pause,
                    "rows": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
