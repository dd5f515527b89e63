"""A reference worker's start with and without a kernel cache of its own, beside a candidate's.

A CUDA reference worker compiles the fused digest's and the fused comparison's kernels
(jiterator, through NVRTC) at its start (:mod:`kerneljudge.worker.warming`). Given no kernel
cache, it compiles them anew every time (``USE_PYTORCH_KERNEL_CACHE=0``); given one
(``PYTORCH_KERNEL_CACHE_PATH`` in its environment, as a judge gives it where the reference's
cache folder is protected: :func:`kerneljudge.judge.reference_side.reference_environment`), it
loads what an earlier worker compiled there.

Workers are started one at a time, each waited for until ready, then closed, in this order per
round: the reference with no kernel cache, the reference with a new empty one (it compiles and
stores), the reference with that same one again (it loads), the reference with none again, and
a candidate worker. Printed: seconds from each start to its ready message.

Run:  PYTHONPATH=src python3 benchmarks/reference_worker_start.py [--device cuda] [--rounds 1]
      [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def rounds(device: str, count: int) -> list[dict[str, Any]]:
    """``count`` rounds; each row: the round, the step's name and its seconds to ready."""
    from kerneljudge.worker.environment import KERNEL_CACHE_ENV
    from kerneljudge.worker.process import WorkerProcess

    rows: list[dict[str, Any]] = []
    for i in range(count):
        with tempfile.TemporaryDirectory(prefix="kj-kernel-cache-") as cache:
            steps = (
                ("reference, no kernel cache", "reference", {}),
                ("reference, new kernel cache", "reference", {KERNEL_CACHE_ENV: cache}),
                ("reference, same kernel cache", "reference", {KERNEL_CACHE_ENV: cache}),
                ("reference, no kernel cache again", "reference", {}),
                ("candidate", "candidate", {}),
            )
            for name, role, env in steps:
                t = time.monotonic()
                worker = WorkerProcess(role, device, dict(env))
                try:
                    worker.wait_ready()
                    ready_s = time.monotonic() - t
                finally:
                    worker.close()
                rows.append({"round": i + 1, "step": name, "ready_s": ready_s})
                print(f"round {i + 1}: {name}: ready in {ready_s:.2f} s", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else args.device
    rows = rounds(device, args.rounds)
    if args.json:
        args.json.write_text(json.dumps({"device": device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
