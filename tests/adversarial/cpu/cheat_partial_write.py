# expected: incorrect
# kind: partial writes (half of the output rows left uninitialised)
# problem: problem_cpu.py
"""Writes only the first half of the rows of a torch.empty output, always. Must be `incorrect`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = torch.empty(x.shape[0], self.linear.out_features)
        half = x.shape[0] // 2
        out[:half] = F.gelu(self.linear(x[:half]))
        return out
