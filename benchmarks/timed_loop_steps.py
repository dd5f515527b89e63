"""What each step of the timed loop costs per call, against the call itself, at a given size.

The problem is an elementwise ``relu`` on one float32 input of ``--mib`` MiB (output the same
size). Each step the worker's timed loop (:func:`kerneljudge.worker.measure.time_calls`) takes
per call is run alone ``--repeat`` times with a device synchronisation on both sides, and its
median host time printed in milliseconds, beside the call's and the bytes the step moves over
that time (GB/s): the freed-memory poison, the input's roll and nudge
(:func:`~kerneljudge.worker.measure.perturb`, written over the previous call's inputs), the L2
flush, the call, the copy of its output taken at the end mark (into a new tensor, and into one
written before, as the CPU loop reuses a call's copies that were not kept), the output's digest
(:func:`kerneljudge.worker.stamps.output_digest`, the device tree at this size: its fused
kernels, and the same digest made of torch's ops; SHA-256, a CPU loop's), a kept output's
copy to the host (pageable; on a GPU page-locked too), and the device's allocation of a block
of the output's size after the caching allocator was emptied (what the worker's ``release``
between requests leaves the next request).

With ``--loops N``, also the whole loop (:func:`~kerneljudge.worker.measure.time_calls`, its
calls committed through a stamp socket as in a verdict) with its end-mark copies written into
new tensors and into reused ones, N runs each, alternating.

Run:  PYTHONPATH=src python3 benchmarks/timed_loop_steps.py [--mib 6144] [--repeat 5]
      [--device cuda] [--loops 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kerneljudge.worker.digest import digest
from kerneljudge.worker.measure import (
    Link,
    _end_copies,
    _host_copies,
    perturb,
    plans,
    poison,
    time_calls,
)
from kerneljudge.worker.stamps import KIND_SHA256, KIND_TREE, Observer, output_digest, socket_pair


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
    parser.add_argument(
        "--loops", type=int, default=0, help="also time whole loops with and without recycling"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    nbytes = args.mib << 20
    x = torch.randn(nbytes // 4 // 4096, 4096, device=device)
    which = plans([x])  # decided once per input set, as the timed loop does
    spare = perturb([x], which, 1, True)
    reused = [torch.empty_like(x)]
    out = torch.relu(x)
    flush = torch.empty(2 * (50 << 20), dtype=torch.uint8, device=device)
    seeds = iter(range(2, 10**6))
    steps: dict[str, tuple[Callable[[], object], int]] = {
        "poison": (lambda: poison(nbytes, device), nbytes),
        "perturb": (lambda: perturb([x], which, next(seeds), True, into=spare), 2 * nbytes),
        "flush": (lambda: flush.fill_(1), flush.numel()),
        "call (relu)": (lambda: torch.relu(x), 2 * nbytes),
        "output copy": (lambda: out.detach().clone(), 2 * nbytes),
        "output copy, buffer reused": (lambda: _end_copies([out], reused), 2 * nbytes),
        "output digest": (lambda: output_digest(out, KIND_TREE), nbytes),
        "output digest, torch ops": (lambda: digest(out, fused=False), nbytes),
        "output digest, SHA-256": (lambda: output_digest(out, KIND_SHA256), nbytes),
        "output to host": (lambda: out.cpu(), nbytes),
    }
    if device.type == "cuda":
        steps["output to host, page-locked"] = (lambda: _host_copies([out]), nbytes)

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
    if args.loops:
        _loops(x, device, args.loops)


def _loops(x: torch.Tensor, device: torch.device, rounds: int) -> None:
    """The whole loop (:func:`time_calls`) observed as in a verdict, through a stamp socket
    (each call's outputs committed by their digests, its seed and slot sent back; no call
    kept), 8 calls per run, with and without ``recycle``, alternating; wall ms per call."""
    walls: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for recycle in (False, True):
            walls[recycle].append(_observed_loop(x, device, recycle) / 8 * 1e3)
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"whole loop, ms per call (median of {rounds} runs of 8 calls, alternating):")
    print(f"  copies into new tensors {off:9.2f}\n  copies into reused ones {on:9.2f}"
          f"   ratio {on / off:.2f}")  # fmt: skip


def _observed_loop(x: torch.Tensor, device: torch.device, recycle: bool) -> float:
    sup, wrk = socket_pair()
    wall = [0.0]

    def request(op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        link = fields["link"]
        times, _, wall[0] = time_calls(
            torch.relu, [[x]], n=fields["n"], warmup=fields["warmup"], device=device,
            flush=None, poison_bytes=0, link=Link(wrk, link["batch"]), seed=link["seed"],
            recycle=recycle,
        )  # fmt: skip
        return {"times_ms": times}

    try:
        Observer(sup).run(request, 600, n=8, warmup=1, keep=lambda i: -1)
    finally:
        sup.close()
        wrk.close()
    return wall[0]


if __name__ == "__main__":
    main()
