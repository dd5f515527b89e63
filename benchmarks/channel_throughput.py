"""Seconds for one tensor to cross the worker channel (:class:`kerneljudge.worker.protocol.
Channel`), with large tensors as raw bytes (the protocol's way) and with everything in the
``torch.save`` part (as every tensor travelled before raw bytes were added), side by side.

For each size (one float32 tensor of ``MiB`` MiB in a message, doubling from ``--min-mib`` to
``--max-mib``) a child process (``os.fork``) reads messages and answers each with a small reply;
the parent sends the message and waits for the reply, ``--repeats`` times each way, the two ways
alternating. Printed per size: the median seconds one way for each, their GB/s, and the ratio
(``torch.save`` part / raw). The ``torch.save``-only way is the same channel with
:data:`~kerneljudge.worker.protocol.RAW_MIN_BYTES` set above every size (nothing else changes).

Run:  PYTHONPATH=src python3 benchmarks/channel_throughput.py [--min-mib 1] [--max-mib 256]
      [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from kerneljudge.worker import protocol
from kerneljudge.worker.protocol import Channel


def _echo(read_fd: int, write_fd: int) -> None:
    """The child: answer each message with ``{"ok": True}`` until ``{"op": "exit"}``."""
    chan = Channel(read_fd, write_fd)
    while True:
        message = chan.recv()
        if message.get("op") == "exit":
            os._exit(0)
        chan.send({"ok": True, "raw": message.get("raw")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:
        _echo(to_child, from_child)
    chan = Channel(to_parent, from_parent)
    raw_min = protocol.RAW_MIN_BYTES
    rows = []
    print(f"{'MiB':>6s} {'raw s':>8s} {'GB/s':>6s} {'save s':>8s} {'GB/s':>6s} {'ratio':>6s}")
    mib = max(1, args.min_mib)
    while mib <= args.max_mib:
        x = torch.randn(mib << 18)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for raw in (True, False):
                protocol.RAW_MIN_BYTES = raw_min if raw else 1 << 62
                started = time.perf_counter()
                chan.send({"x": x, "raw": raw})
                chan.recv()
                times[raw].append(time.perf_counter() - started)
        protocol.RAW_MIN_BYTES = raw_min
        raw_s, save_s = statistics.median(times[True]), statistics.median(times[False])
        nbytes = x.numel() * 4
        row = {"mib": mib, "raw_s": raw_s, "save_s": save_s, "ratio": save_s / raw_s}
        rows.append(row)
        print(
            f"{mib:6d} {raw_s:8.3f} {nbytes / raw_s / 1e9:6.2f} {save_s:8.3f}"
            f" {nbytes / save_s / 1e9:6.2f} {save_s / raw_s:6.2f}",
            flush=True,
        )
        mib *= 2
    chan.send({"op": "exit"})
    os.waitpid(pid, 0)
    if args.json:
        meta = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
