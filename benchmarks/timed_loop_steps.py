"""What each step of the timed loop costs per call, against the call itself, at a given size.

The problem is an elementwise ``relu`` on one float32 input of ``--mib`` MiB (output the same
size). Each step the worker's timed loop (:func:`kerneljudge.worker.measure.time_calls`) takes
per call is run alone ``--repeat`` times with a device synchronisation on both sides, and its
median host time printed in milliseconds, beside the call's and the bytes the step moves over
that time (GB/s): the freed-memory poison, the input's roll and nudge
(:func:`~kerneljudge.worker.measure.perturb`, written over the previous call's inputs), the L2
flush, the call, the copy of its output taken at the end mark, the output's digest
(:func:`kerneljudge.worker.stamps.output_digest`, the device tree at this size: its fused
kernels, and the same digest made of torch's ops), a kept output's copy to the host, and the
device's allocation of a block of the output's size after the caching allocator was emptied
(what the worker's ``release`` between requests leaves the next request).

Run:  PYTHONPATH=src python3 benchmarks/timed_loop_steps.py [--mib 6144] [--repeat 5]
      [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kerneljudge.worker.digest import digest
from kerneljudge.worker.measure import perturb, plans, poison
from kerneljudge.worker.stamps import KIND_TREE, output_digest


def _timed(step: Callable[[], object], repeat: int, device: torch.device) -> float:
    """Median milliseconds of ``step`` over ``repeat`` runs, synchronised on both sides."""
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=6144)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    nbytes = args.mib << 20
    x = torch.randn(nbytes // 4 // 4096, 4096, device=device)
    which = plans([x])  # decided once per input set, as the timed loop does
    spare = perturb([x], which, 1, True)
    out = torch.relu(x)
    flush = torch.empty(2 * (50 << 20), dtype=torch.uint8, device=device)
    seeds = iter(range(2, 10**6))
    steps: dict[str, tuple[Callable[[], object], int]] = {
        "poison": (lambda: poison(nbytes, device), nbytes),
        "perturb": (lambda: perturb([x], which, next(seeds), True, into=spare), 2 * nbytes),
        "flush": (lambda: flush.fill_(1), flush.numel()),
        "call (relu)": (lambda: torch.relu(x), 2 * nbytes),
        "output copy": (lambda: out.detach().clone(), 2 * nbytes),
        "output digest": (lambda: output_digest(out, KIND_TREE), nbytes),
        "output digest, torch ops": (lambda: digest(out, fused=False), nbytes),
        "output to host": (lambda: out.cpu(), nbytes),
    }
    if device.type == "cuda":

        def fresh() -> None:
            torch.cuda.empty_cache()
            torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(0)

        steps["allocation after empty_cache"] = (fresh, nbytes)
    call_ms = 0.0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.mib} MiB float32 on {device} ({name})")
    print(f"{'step':32s} {'ms':>9s} {'x call':>7s} {'GB/s':>7s}")
    for name, (step, moved) in steps.items():
        step()  # first run not counted (allocations, kernels' first launch)
        ms = _timed(step, args.repeat, device)
        if name.startswith("call"):
            call_ms = ms
        ratio = f"{ms / call_ms:7.2f}" if call_ms else f"{'':7s}"
        print(f"{name:32s} {ms:9.2f} {ratio} {moved / ms / 1e6:7.1f}", flush=True)


if __name__ == "__main__":
    main()
