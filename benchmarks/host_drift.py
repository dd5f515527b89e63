"""How fast the timing core is from one moment to the next, and what slows it.

A warm verdict times the reference and the candidate on one pinned core
(:func:`kerneljudge.worker.process.timing_cpu`), and host-side launch overhead is part of every
timed GPU call. This script samples that core's speed with two fixed probes, pinned to the same
core, through phases a judge goes through:

* ``idle``: nothing else runs;
* ``load``: every core but the timing core busy (as while candidates build on the machine);
* ``after``: the load gone (the next verdict after a build);
* ``starter paused at T s``: a process that imports torch and creates a device context (a worker
  started ahead of need) is stopped with ``SIGSTOP`` T seconds into its start-up, as the judge
  stops it, and the probes run while it is stopped.

Probes, in milliseconds: ``python``, a fixed pure-Python loop (best of 3 per sample);
``launch``, 200 one-element kernel launches and a device-wide sync (GPU machines only).
Each phase prints the probes' median, 10th and 90th percentile, relative to ``idle``.

Run:  PYTHONPATH=src python3 benchmarks/host_drift.py [--phase-s 10] [--load-s 30] [--stops 0.5,3]
      [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

from kerneljudge.worker.process import timing_cpu


def _busy(cpu: int, seconds: float) -> None:
    os.sched_setaffinity(0, {cpu})
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def _python_ms() -> float:
    t0 = time.perf_counter_ns()
    s = 0
    for i in range(20_000):
        s += i * i
    return (time.perf_counter_ns() - t0) / 1e6


def _launch_ms(x: torch.Tensor | None) -> float | None:
    if x is None:
        return None
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(200):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / 1e6


def _sample(seconds: float, x: torch.Tensor | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"python": [], "launch": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out["python"].append(min(_python_ms() for _ in range(3)))
        launch = _launch_ms(x)
        if launch is not None:
            out["launch"].append(launch)
        time.sleep(0.02)
    return out


def _stats(values: list[float], base: float | None) -> dict[str, float] | None:
    if not values:
        return None
    med, p10, p90 = (float(v) for v in np.percentile(values, [50, 10, 90]))
    return {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "vs_idle": med / base if base else 1.0}


_STARTER = (
    "import torch, sys; torch.zeros(1, device='cuda' if torch.cuda.is_available() else 'cpu'); "
    "sys.stdin.read()"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per probe phase")
    parser.add_argument("--load-s", type=float, default=30.0, help="seconds of all-core load")
    parser.add_argument("--stops", default="0.5,3", help="starter pause points, seconds")
    parser.add_argument("--json", help="write the phases here")
    args = parser.parse_args()

    cpu = timing_cpu()
    others = sorted(os.sched_getaffinity(0) - {cpu})
    os.sched_setaffinity(0, {cpu})
    cuda = torch.cuda.is_available()
    x = torch.zeros(1, device="cuda") if cuda else None
    if x is not None:
        _launch_ms(x)
    rows: list[dict[str, object]] = []
    base: dict[str, float | None] = {}
    print(f"timing core {cpu}, {len(others)} other cores, device {'cuda' if cuda else 'cpu'}")
    print(
        f"{'phase':<26}{'python ms':>10}{'p10-p90':>16}{'x idle':>8}"
        f"{'launch ms':>11}{'p10-p90':>16}{'x idle':>8}",
        flush=True,
    )

    def phase(name: str, samples: dict[str, list[float]]) -> None:
        """Print and keep one phase at once: a run cut short keeps what it measured."""
        if not base:
            base.update({k: (float(np.median(v)) if v else None) for k, v in samples.items()})
        row = {"phase": name, **{k: _stats(v, base[k]) for k, v in samples.items()}}
        rows.append(row)
        line = f"{name:<26}"
        for k in ("python", "launch"):
            s = row[k]
            line += (
                f"{s['median_ms']:>10.3f}{s['p10_ms']:>8.3f}-{s['p90_ms']:<7.3f}{s['vs_idle']:>8.3f}"
                if isinstance(s, dict)
                else f"{'-':>10}{'':>16}{'':>8}"
            )
        print(line, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"cpu": cpu, "cuda": cuda, "phases": rows}, f, indent=1)

    phase("idle", _sample(args.phase_s, x))
    ctx = mp.get_context("spawn")
    busy = [ctx.Process(target=_busy, args=(c, args.load_s)) for c in others]
    for p in busy:
        p.start()
    phase("load", _sample(args.load_s - 2, x))
    for p in busy:
        p.join()
    phase("after 0-10 s", _sample(10, x))
    phase("after 10-20 s", _sample(10, x))
    for stop in (float(s) for s in args.stops.split(",") if s):
        starter = subprocess.Popen(
            [sys.executable, "-c", _STARTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        time.sleep(stop)
        starter.send_signal(signal.SIGSTOP)
        phase(f"starter paused at {stop:g} s", _sample(args.phase_s / 2, x))
        starter.send_signal(signal.SIGCONT)
        starter.stdin.close()  # type: ignore[union-attr]  # it exits once it is up
        try:
            starter.wait(timeout=60)
        except subprocess.TimeoutExpired:
            starter.kill()
            starter.wait()
        phase(f"after starter {stop:g} s", _sample(args.phase_s / 2, x))


if __name__ == "__main__":
    main()
