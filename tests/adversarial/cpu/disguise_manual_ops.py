# expected: rejected
# kind: reference in disguise (equivalent PyTorch ops: matmul, addition, erf)
# problem: problem_cpu_policy.py
"""The same computation spelt with other PyTorch ops (torch.addmm, torch.erf, elementwise
arithmetic): still no custom kernel. The policy problem requires one: `rejected`."""

import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.addmm(self.linear.bias, x, self.linear.weight.t())
        return 0.5 * y * (1.0 + torch.erf(y * (1.0 / math.sqrt(2.0))))
