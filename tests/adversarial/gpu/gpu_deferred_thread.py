# expected: correct|rejected|incorrect
# kind: work the timer does not see (hidden thread launches the kernels after the call)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest in correctness trials and in the timed calls whose outputs the judge keeps (read off
the timing loop's locals on the stack: i, n, warmup, input sets). Every other timed call
allocates its output and returns at once; a hidden background thread (_thread.start_new_thread)
launches the real computation on its own stream a moment later, after the timer's
synchronisation and end mark. The thread keeps only the newest job."""

import _thread
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2)


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
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.ready = threading.Semaphore(0)
        self.job = None
        self.started = False

    def _loop(self):
        stream = torch.cuda.Stream()
        while True:
            self.ready.acquire()
            with self.lock:
                job, self.job = self.job, None
            if job is None:
                continue
            q, k, v, out = job
            time.sleep(0.0003)  # let the timer's synchronize() and end mark pass first
            with torch.no_grad(), torch.cuda.stream(stream):
                out.copy_(attention(q, k, v))
            stream.synchronize()

    def forward(self, q, k, v):
        f = _timing_frame()
        if f is None:
            return attention(q, k, v).contiguous()
        loc = f.f_locals
        if not _unchecked(loc):
            return attention(q, k, v).contiguous()
        if not self.started:
            self.started = True
            _thread.start_new_thread(self._loop, ())
        out = torch.empty_like(q)
        with self.lock:
            self.job = (q, k, v, out)
        self.ready.release()
        return out
