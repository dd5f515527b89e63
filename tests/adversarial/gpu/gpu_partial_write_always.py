# expected: incorrect
# kind: partial writes (only the first half of the sequence written into torch.empty)
# problem: ../fixtures/causal_gqa_any_kernel.py
"""Computes only the first half of the query positions (causal: exactly the first half of the
work) into a torch.empty output and leaves the rest uninitialised. Must be `incorrect`."""

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


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        out = torch.empty_like(q)
        h = q.shape[1] // 2
        out[:, :h] = attention(q[:, :h], k[:, :h], v[:, :h])
        return out
