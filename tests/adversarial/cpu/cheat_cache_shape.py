# expected: incorrect
# kind: result cache keyed on the input shape
# problem: problem_cpu.py
"""Computes the first call honestly and returns that result for every later call of the same
shape. Caught when correctness trials use fresh inputs."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.cache = {}

    def forward(self, x):
        key = tuple(x.shape)
        if key not in self.cache:
            self.cache[key] = F.gelu(self.linear(x))
        return self.cache[key]
