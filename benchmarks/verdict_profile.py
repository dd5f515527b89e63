"""Where one verdict's time goes: its stages, the supervisor's time per worker request, and the
supervisor's own hottest functions.

The problem and candidate are :mod:`supervisor_memory`'s (``tanh(x) * 0.5`` on ``--mib`` MiB of
float32, input and output of that size; the candidate the same code as ``ModelNew``), judged
on its ``public`` shape set. One judge judges it ``--verdicts``
times (the first is cold: workers start, the reference is prepared); it prints each verdict's
stage seconds (``Verdict.stage_s``) and what it reduced for want of memory
(``Verdict.reductions``) and, for the last verdict, the seconds the supervisor
waited on each kind of request to each worker (role, request: total seconds and count; a
request's time includes sending its tensors and receiving the reply), and the supervisor's
functions by their own time (``cProfile``; the workers' time shows as waiting in ``select``).

Run:  PYTHONPATH=src python3 benchmarks/verdict_profile.py [--mib 64] [--device cpu] [--workers]
      [--verdicts 2] [--top 15] [--no-graph] [--baselines eager,compile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _requests import count_requests
from supervisor_memory import CANDIDATE, PROBLEM

from kerneljudge import Judge, JudgeConfig
from kerneljudge.worker.profiling import PROFILE_ENV


def _print_speedups(verdict: Any) -> None:
    """The verdict's speedups over eager: launched calls, and CUDA-graph replays where timed
    (with the share of each side's launched time spent waiting for the host)."""
    t = verdict.timing
    if t is None or t.speedup("eager") is None:
        return
    for what, timing in (("launched", t), ("replayed", t.graph)):
        sp = timing.speedup("eager") if timing is not None else None
        if sp is not None:
            lo, hi = sp.ci95
            print(f"  {what}: x{sp.median:.3f} [{lo:.3f}, {hi:.3f}]", end="")
    if t.graph is not None:
        shares = " ".join(f"{k} {v:.2f}" for k, v in t.graph.host_share.items())
        print(f" | host share {shares} {t.graph.note}", end="")
    print(flush=True)


def _print_timeline(timeline: list[tuple[float, float, str, str]], t0: float) -> None:
    """Each request of the last verdict (start and seconds from the verdict's start) and each
    stage's start (``judge.progress``), with the seconds no request was in flight before it."""
    print("timeline (s from the verdict's start; gap: no request in flight before it):")
    busy_until = t0
    for start, end, role, what in sorted(timeline):
        gap = max(0.0, start - busy_until)
        if role:
            print(f"  {start - t0:7.3f} gap {gap:6.3f}  {role:9s} {what:14s} {end - start:6.3f}")
            busy_until = max(busy_until, end)
        else:
            print(f"  {start - t0:7.3f} gap {gap:6.3f}  -- {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--verdicts", type=int, default=2)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--workers", action="store_true", help="also profile the workers' request handlers"
    )
    parser.add_argument("--problem", type=Path, default=None, help="another problem file")
    parser.add_argument("--candidate", type=Path, default=None, help="its candidate")
    parser.add_argument(
        "--baselines", default="eager", help="comma list of eager, compile (default: eager)"
    )
    parser.add_argument(
        "--no-graph", action="store_true", help="no CUDA-graph timing pass (launched calls only)"
    )
    parser.add_argument(
        "--timeline", action="store_true", help="the last verdict's requests and stages in order"
    )
    args = parser.parse_args()
    kept = Path(tempfile.mkdtemp(prefix="kj-worker-profiles-")) if args.workers else None
    if kept is not None:
        os.environ[PROFILE_ENV] = str(kept)
    timeline: list[tuple[float, float, str, str]] = []
    spent = count_requests(timeline)
    with tempfile.TemporaryDirectory() as tmp:
        problem, candidate = Path(tmp) / "problem.py", Path(tmp) / "candidate.py"
        n = args.mib * (1 << 20) // 4
        problem.write_text(textwrap.dedent(PROBLEM.format(n=n, half=n // 2)))
        candidate.write_text(textwrap.dedent(CANDIDATE))
        if args.problem is not None:
            problem, candidate = args.problem, args.candidate
        config = JudgeConfig(
            device=args.device,
            baselines=tuple(args.baselines.split(",")),
            cache_dir=Path(tmp) / "c",
            graph_timing=not args.no_graph,
        )
        with Judge(problem, config) as judge:
            judge.progress = lambda line: timeline.append((time.perf_counter(), 0.0, "", line))
            for i in range(args.verdicts):
                spent.clear()
                timeline.clear()
                profile = cProfile.Profile()
                t0 = time.perf_counter()
                profile.enable()
                verdict = judge.evaluate(candidate)
                profile.disable()
                seconds = time.perf_counter() - t0
                timeline.append((time.perf_counter(), 0.0, "", "(verdict)"))
                last = list(timeline)  # the work started after it is the next verdict's
                print(f"verdict {i + 1}: {verdict.status.value} in {seconds:.1f} s", flush=True)
                print("  stages (s):", " ".join(f"{k} {v:.2f}" for k, v in verdict.stage_s.items()))
                for line in verdict.reductions:
                    print(f"  reduced for want of memory: {line}")
                _print_speedups(verdict)
    if verdict.timing is not None:
        t = verdict.timing
        counts = " ".join(f"{m.name} {m.samples}" for m in t.measurements)
        print(f"timing: {t.passes} pass(es), {t.rounds} rounds, stop {t.stop_reason}; {counts}")
        if t.timer_note or (t.host and t.host.noisy):
            print(f"  note: {t.timer_note or ''} noisy: {t.host.noise_reasons if t.host else ''}")
    if args.timeline:
        _print_timeline(last, t0)
    print("requests (role, request: total s / count):")
    for (role, op), times in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {role:10s} {op:16s} {sum(times):7.2f} s / {len(times)}")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    for role in ("reference", "candidate") if kept is not None else ():
        files = sorted(str(p) for p in kept.glob(f"{role}-*.prof"))
        if files:
            out = io.StringIO()
            print(f"worker profile: {role} ({len(files)} workers, every verdict)")
            stats = pstats.Stats(*files, stream=out)
            stats.sort_stats("tottime").print_stats(args.top)
            stats.sort_stats("cumulative").print_stats(args.top)
            print(out.getvalue())


if __name__ == "__main__":
    main()
