# expected: incorrect
# kind: smaller problem (every other row computed, copied to its neighbour)
# problem: problem_cpu.py
"""Computes the even rows only and copies each into the following odd row."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        even = F.gelu(self.linear(x[0::2]))
        return even.repeat_interleave(2, dim=0)[: x.shape[0]].contiguous()
