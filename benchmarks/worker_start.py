"""Where a worker's start-up goes: its phases in a fresh interpreter, and real workers' start.

A first verdict waits for its workers to come up (the verdict's ``worker`` stage: 6.4-9.1 s
for a fresh process on the H200 machine, ``docs/benchmarks/2026-12-04-h200-weak-scaling-8gib-
oracles-episode-memory.md``). Two measurements, ``--rounds`` times each, one after the other:

* ``phases``: a fresh ``python3`` (unconfined, this checkout's ``src``) times, in order, what
  :func:`kerneljudge.worker.runtime.main` does before it reports ready: ``import torch``, the
  import of :mod:`kerneljudge.worker.runtime`, the device context (``torch.cuda.set_device``
  and a first allocation, synchronised), the fused digest's warm-up
  (:func:`kerneljudge.worker.digest.warm`: its NVRTC kernels) and the operator recorder's
  first call (what ``--record-ops`` loads). With ``--kernel-cache fresh`` each round gets an
  empty ``PYTORCH_KERNEL_CACHE_PATH`` (torch's on-disk cache of run-time compiled kernels),
  so the warm-up compiles; with ``shared`` the rounds share one, so only the first compiles;
  ``inherit`` leaves the variable as this process has it (what a worker sees).
* ``workers``: a reference and a candidate :class:`~kerneljudge.worker.process.WorkerProcess`
  started at once, as a judge starts them, confined; seconds from each start to its ready
  message; ``--rounds`` pairs of rounds, the reference worker's kernel cache first emptied of
  this process's seed, then filled from it (:func:`workers`).

On a CPU device the context, digest and recorder phases are skipped (the recorder is timed
with ``--record-ops``).

Run:  PYTHONPATH=src python3 benchmarks/worker_start.py [--device cuda] [--rounds 3]
      [--kernel-cache fresh|shared|inherit] [--record-ops] [--skip-phases] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _oneshot import run_one  # noqa: E402

CHILD = """
import json, sys, time
device, record_ops = sys.argv[1], sys.argv[2] == "1"
out = {}
t = time.monotonic()
import torch
out["import_torch"] = time.monotonic() - t
t = time.monotonic()
from kerneljudge.worker import digest, runtime
out["import_worker"] = time.monotonic() - t
if device.startswith("cuda"):
    t = time.monotonic()
    torch.cuda.set_device(torch.device(device))
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    out["context"] = time.monotonic() - t
    t = time.monotonic()
    out["digest_compiled"] = digest.warm(torch.device(device))
    torch.cuda.synchronize()
    out["digest_warm"] = time.monotonic() - t
if record_ops:
    t = time.monotonic()
    with runtime.OpRecorder():
        torch.ones(1, device=device).add_(1)
    out["record_ops"] = time.monotonic() - t
print("RESULT " + json.dumps(out))
"""

PHASES = ("import_torch", "import_worker", "context", "digest_warm", "record_ops")


def phases(device: str, rounds: int, cache: str, record_ops: bool) -> list[dict[str, Any]]:
    """One fresh interpreter per round; each row: the phases' seconds and the round's total."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kj-kernel-cache-") as shared:
        for i in range(rounds):
            with tempfile.TemporaryDirectory(prefix="kj-kernel-cache-") as fresh:
                env = {}
                if cache != "inherit":
                    env["PYTORCH_KERNEL_CACHE_PATH"] = fresh if cache == "fresh" else shared
                t = time.monotonic()
                cmd = [sys.executable, "-c", CHILD, device, "1" if record_ops else "0"]
                row = run_one(cmd, 600.0, env)
                row["wall"] = time.monotonic() - t
            row["round"] = i + 1
            rows.append(row)
            shown = "  ".join(f"{k} {row[k]:.2f}" for k in PHASES if isinstance(row.get(k), float))
            print(f"phases {i + 1}: {shown}  wall {row['wall']:.2f} s", flush=True)
    return rows


def workers(device: str, rounds: int, record_ops: bool) -> list[dict[str, Any]]:
    """A reference and a candidate worker started at once per round: seconds to ready. The
    rounds alternate between the reference worker's kernel cache filled from this process's
    seed (``seeded``: :mod:`kerneljudge.worker.kernel_cache`, where it is usable) and the seed
    dropped first (``compiled``: the worker compiles its kernels and gives the next seed)."""
    from kerneljudge.worker import kernel_cache
    from kerneljudge.worker.process import WorkerProcess

    rows: list[dict[str, Any]] = []
    for i in range(2 * rounds):
        way = "seeded" if i % 2 else "compiled"
        if way == "compiled":
            kernel_cache.forget()
        t = time.monotonic()
        started = [
            WorkerProcess("reference", device, record_ops=record_ops),
            WorkerProcess("candidate", device, record_ops=record_ops),
        ]
        row: dict[str, Any] = {"round": i // 2 + 1, "way": way, "seed": len(kernel_cache.seed())}
        try:
            for w in started:
                w.wait_ready()
                row[w.role] = time.monotonic() - t
        finally:
            for w in started:
                w.close()
        rows.append(row)
        print(
            f"workers {i // 2 + 1} {way:>8} (seed of {row['seed']} files): reference ready "
            f"{row['reference']:.2f} s, candidate ready {row['candidate']:.2f} s",
            flush=True,
        )
    return rows


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), float)]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-phases", action="store_true", help="only the workers' starts")
    parser.add_argument("--kernel-cache", choices=("fresh", "shared", "inherit"), default="fresh")
    parser.add_argument("--record-ops", action="store_true", help="time the operator recorder")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else args.device
    rows_p = (
        [] if args.skip_phases else phases(device, args.rounds, args.kernel_cache, args.record_ops)
    )
    rows_w = workers(device, args.rounds, args.record_ops)
    print("\nmedian seconds")
    for key in (*PHASES, "wall"):
        m = _median(rows_p, key)
        if m is not None:
            print(f"  phase {key:14s} {m:6.2f}")
    for way in ("compiled", "seeded"):
        for key in ("reference", "candidate"):
            m = _median([r for r in rows_w if r["way"] == way], key)
            if m is not None:
                print(f"  {key} worker ready ({way}) {m:6.2f}")
    if args.json:
        record = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[1:],
            "cpus": len(os.sched_getaffinity(0)),
            "phases": rows_p,
            "workers": rows_w,
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
