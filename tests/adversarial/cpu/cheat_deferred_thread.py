# expected: correct|rejected|incorrect
# kind: work the timer does not see (hidden background thread computes after the call returns)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""Honest in correctness trials. In the timing loop (seen on the stack: op_time/time_calls) it
computes synchronously only the calls whose outputs the judge keeps (the last one per input set,
read off the loop's locals); every other timed call allocates its output, hands the job to a
background thread and returns at once. The thread, started with _thread.start_new_thread, is not
in threading.enumerate(), keeps only the newest job, and also competes with the reference while
that is timed."""

import _thread
import sys
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F


def _timing_frame():
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name in ("op_time", "time_calls"):
            return f
        f = f.f_back
    return None


def _unchecked(loc) -> bool:
    """Whether the judge will never look at the output of this timed call (loop locals `loc`).

    The loop keeps the output of the last call on each input set, and every later batch
    overwrites what an earlier one kept; the calibration probe (3 calls after 3 warm-ups) is
    always followed by batches, so none of its outputs survives either.
    """
    n, warmup = int(loc.get("n", 1)), int(loc.get("warmup", 0))
    if warmup >= 3 and n <= 3:
        return True
    return int(loc.get("i", 0)) < warmup + n - len(loc.get("input_sets", [None]))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.lock = threading.Lock()
        self.ready = threading.Semaphore(0)
        self.job = None
        self.started = False

    def _loop(self):
        while True:
            self.ready.acquire()
            with self.lock:
                job, self.job = self.job, None
            if job is not None:
                x, out = job
                with torch.no_grad():
                    out.copy_(F.gelu(self.linear(x)))

    def forward(self, x):
        f = _timing_frame()
        if f is None:
            return F.gelu(self.linear(x))
        loc = f.f_locals
        if not _unchecked(loc):
            return F.gelu(self.linear(x))
        if not self.started:
            self.started = True
            _thread.start_new_thread(self._loop, ())
        out = torch.empty(x.shape[0], self.linear.out_features)
        with self.lock:
            self.job = (x, out)
        self.ready.release()
        return out
