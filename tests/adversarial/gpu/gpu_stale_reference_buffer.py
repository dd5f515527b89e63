# expected: incorrect
# kind: stale memory (hoping for the reference's freed output buffer)
# problem: ../fixtures/causal_gqa_any_kernel.py
"""Returns torch.empty_like(q), never written, hoping that the allocator hands back the block in
which the reference just wrote its output. The reference runs in another process, so it cannot:
must be `incorrect`."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return torch.empty_like(q)
