# expected: rejected
# kind: changing the inputs in place
# problem: problem_cpu.py
"""Computes the right output and then overwrites its input x in place (x.zero_()). Model never
modifies its inputs; a drop-in replacement that clobbers the caller's tensor is wrong, and the
judge should notice (compare the inputs after the call with a copy taken before): `rejected`."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        out = F.gelu(self.linear(x))
        x.zero_()
        return out
