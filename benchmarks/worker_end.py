"""What a worker's end costs: :meth:`WorkerProcess.close` with the pidfd wait against
``Popen.wait``'s polling, side by side.

Every verdict ends by closing its candidate's worker, and returns only once that worker's
process tree has ended and been reaped. ``close`` asks the worker to exit, kills what is left
and waits for the launcher to end. That wait went through ``subprocess.Popen.wait(timeout)``,
which sleeps between polls (0.5 ms doubling to 50 ms); it now goes through
:func:`kerneljudge.worker.process.wait_exited`, woken by a pidfd when the process ends.

Per round, one worker of the ``candidate`` role is started, made ready, left idle for
``--idle`` seconds and closed: the rounds alternate between the two waits (``polled``:
``wait_exited`` replaced by ``Popen.wait`` for that round; ``pidfd``: as shipped). Printed:
each round's seconds in ``close``, then each way's median and their ratio.

Run:  PYTHONPATH=src python3 benchmarks/worker_end.py [--device cuda] [--rounds 8]
      [--idle 0.3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any


def _polled(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    return proc.wait(timeout=timeout_s)


def rounds(device: str, count: int, idle_s: float) -> list[dict[str, Any]]:
    """``count`` rounds per way, alternating; each row: the way and its ``close`` seconds."""
    from kerneljudge.worker import process

    shipped = process.wait_exited
    rows: list[dict[str, Any]] = []
    try:
        for i in range(2 * count):
            way = "pidfd" if i % 2 else "polled"
            process.wait_exited = shipped if way == "pidfd" else _polled  # type: ignore[assignment]
            worker = process.WorkerProcess("candidate", device)
            try:
                worker.wait_ready()
                time.sleep(idle_s)
            finally:
                t = time.perf_counter()
                worker.close()
                close_s = time.perf_counter() - t
            rows.append({"round": i // 2 + 1, "way": way, "close_s": close_s})
            print(f"{way:>6} {i // 2 + 1}: close {close_s * 1000:.1f} ms", flush=True)
    finally:
        process.wait_exited = shipped
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each way")
    parser.add_argument("--idle", type=float, default=0.3, help="seconds a ready worker idles")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else args.device
    rows = rounds(device, args.rounds, args.idle)
    medians = {
        way: statistics.median(r["close_s"] for r in rows if r["way"] == way)
        for way in ("polled", "pidfd")
    }
    polled, pidfd = medians["polled"], medians["pidfd"]
    print(
        f"median close: polled {polled * 1000:.1f} ms, pidfd {pidfd * 1000:.1f} ms, "
        f"pidfd / polled {pidfd / polled:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({"device": device, "rows": rows, "medians": medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
