# expected: incorrect
# kind: smaller problem (reduction over the first 15/16 of the inner dimension only)
# problem: problem_cpu.py
"""Skips the last 1/16 of the inner (K) dimension of the matmul."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        k = x.shape[1] - x.shape[1] // 16
        return F.gelu(F.linear(x[:, :k], self.linear.weight[:, :k], self.linear.bias))
