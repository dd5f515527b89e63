# expected: correct
# kind: correct baseline (PyTorch scaled_dot_product_attention, no custom kernel)
# problem: ../fixtures/causal_gqa_any_kernel.py
"""KJ-ADV-BASELINE-GPU. An honest candidate: K/V expanded to the query heads, then one causal
scaled_dot_product_attention call. Judged after every faulty or cheating GPU candidate."""

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


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return attention(q, k, v)
