"""What preparing one timed call's inputs costs: :func:`kerneljudge.worker.measure.perturb`
making new tensors against writing over the previous call's (its ``into``), per input size.

One float32 input of ``MiB`` MiB shaped ``(rows, 4096)``, on ``--device``; each way is timed
``--calls`` times, the two ways alternating call by call (the same moments of the host), with
one untimed call each first. Printed per size: the median ms per call of each way and their
ratio (new / written over). On CUDA each call ends with a device synchronisation.

``--columns``: instead, both written over, the input's plan (rows in a random order and the
last dimension rolled, ``Plan(0, columns=True)``) against the rows alone (``Plan(0)``), and
their ratio: what the column roll costs.

Run:  PYTHONPATH=src python3 benchmarks/perturb_cost.py [--device cpu] [--sizes 16,64,128,256]
      [--calls 15] [--threads N] [--columns]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Any

import torch

from kerneljudge.worker.measure import Plan, perturb, plans

COLUMNS = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="16,64,128,256", help="input MiB, comma-separated")
    parser.add_argument("--calls", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads")
    parser.add_argument("--columns", action="store_true", help="the column roll's cost")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{platform.node()} {device} torch {torch.__version__} threads {torch.get_num_threads()}")
    if args.columns:
        print(f"{'MiB':>6} {'roll ms':>9} {'rows ms':>9} {'roll/rows':>9}")
    else:
        print(f"{'MiB':>6} {'new ms':>9} {'over ms':>9} {'new/over':>9}")
    for mib in (int(s) for s in args.sizes.split(",")):
        x = torch.randn((mib << 20) // (4 * COLUMNS), COLUMNS, device=device)
        which = plans([x])  # decided once per input set, as the timed loop does
        assert which == [Plan(0, columns=True)], which
        spare: list[Any] | None = None
        other: list[Any] | None = None
        new: list[float] = []
        over: list[float] = []
        for i in range(args.calls + 1):
            t0 = time.perf_counter()
            if args.columns:
                spare = perturb([x], which, i, into=spare)
            else:
                made = perturb([x], which, i)
                del made
            sync()
            t1 = time.perf_counter()
            if args.columns:
                other = perturb([x], [Plan(0)], i, into=other)
            else:
                spare = perturb([x], which, i, into=spare)
            sync()
            t2 = time.perf_counter()
            if i:
                new.append((t1 - t0) * 1e3)
                over.append((t2 - t1) * 1e3)
        a, b = statistics.median(new), statistics.median(over)
        print(f"{mib:>6} {a:>9.1f} {b:>9.1f} {a / b:>9.2f}", flush=True)
        del x, spare, other


if __name__ == "__main__":
    main()
