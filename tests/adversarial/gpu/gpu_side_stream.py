# expected: correct|rejected
# kind: work on another CUDA stream, never synchronised with the current one
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest SDPA, but run on a private side stream; forward returns without making the current
stream wait (no wait_stream, no record_stream). With CUDA events on the current stream alone the
timer would see nothing; with a device-wide synchronisation before the end mark (as the design
says) the work is timed: `correct` with an honest speedup."""

import torch
import torch.nn as nn
import torch.nn.functional as F

_side = None


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2).contiguous()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        global _side
        if _side is None:
            _side = torch.cuda.Stream()
        with torch.cuda.stream(_side):
            return attention(q, k, v)
