# expected: runtime_error
# kind: GPU out-of-memory (one 1 TiB allocation)
# problem: ../fixtures/causal_gqa_any_kernel.py
"""Asks the CUDA caching allocator for 1 TiB: torch.OutOfMemoryError. runtime_error."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        big = torch.empty(1 << 40, dtype=torch.uint8, device=q.device)
        return big[: q.numel() * 4].view(torch.float32).view_as(q)
