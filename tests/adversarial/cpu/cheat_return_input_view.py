# expected: rejected
# kind: returning a view of an input (output written into the input's memory)
# problem: problem_cpu.py
"""Computes the right values, stores them into the first out_features columns of its input x
(in place) and returns that view of x. The output aliases (and has clobbered) the caller's input:
`rejected`."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = F.gelu(self.linear(x))
        view = x[:, : y.shape[1]]
        view.copy_(y)
        return view
