# expected: correct|rejected|incorrect
# kind: partial writes into a stale output block (half the work, only during timing)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest for the first TRIALS calls. During timing it takes back one of its own earlier output
blocks from the caching allocator and recomputes only the first half of the query positions into
it; the second half still holds the right values from an earlier identical call."""

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
    return o.transpose(1, 2)


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
                    h = q.shape[1] // 2
                    buf[:, :h] = attention(q[:, :h], k[:, :h], v[:, :h])
                    return buf
                keep.append(buf)
        out = attention(q, k, v).contiguous()
        if self.calls >= TRIALS:
            self.ptrs.add(out.data_ptr())
        return out
