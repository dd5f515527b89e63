# expected: incorrect
# kind: smaller problem (only the first half of the batch; the rest zeros)
# problem: problem_cpu.py
"""Computes the first half of the batch rows and leaves zeros for the rest."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = torch.zeros(x.shape[0], self.linear.out_features)
        half = x.shape[0] // 2
        out[:half] = F.gelu(self.linear(x[:half]))
        return out
