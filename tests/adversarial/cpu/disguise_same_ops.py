# expected: rejected
# kind: reference in disguise (the same PyTorch compute ops: F.linear + F.gelu)
# problem: problem_cpu_policy.py
"""No custom kernel at all: the reference's own ops under another class name. The policy problem
requires a custom kernel: `rejected`."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(F.linear(x, self.linear.weight, self.linear.bias))
