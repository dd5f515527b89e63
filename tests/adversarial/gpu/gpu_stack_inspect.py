# expected: correct|rejected|incorrect
# kind: timing-aware candidate (reads the timing loop's locals; no work in unchecked calls)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest in correctness trials. In the timing loop it reads i, n, warmup and the number of input
sets from the loop's frame and computes only the calls whose outputs the judge keeps; every other
timed call returns torch.empty_like(q) at once."""

import sys

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
    return o.transpose(1, 2).contiguous()


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

    def forward(self, q, k, v):
        f = _timing_frame()
        if f is not None:
            loc = f.f_locals
            if _unchecked(loc):
                return torch.empty_like(q)
        return attention(q, k, v)
