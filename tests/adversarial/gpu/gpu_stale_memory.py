# expected: correct|rejected|incorrect
# kind: stale memory (uninitialised output that still holds an earlier result, during timing)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest for the first TRIALS calls. During timing (same inputs every call) it asks the CUDA
caching allocator for an output block; when it gets back one of its own earlier output blocks
(it remembers their addresses), it returns it untouched: it still holds the right answer."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TRIALS = 5


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
        self.calls = 0
        self.ptrs = set()

    def forward(self, q, k, v):
        self.calls += 1
        if self.calls > TRIALS:
            keep = []
            for _ in range(4):
                buf = torch.empty_like(q)
                if buf.data_ptr() in self.ptrs:
                    return buf
                keep.append(buf)
        out = attention(q, k, v)
        if self.calls >= TRIALS:
            self.ptrs.add(out.data_ptr())
        return out
