# expected: timeout
# kind: host-side infinite loop
# problem: problem_cpu.py
"""A pure-Python busy loop that never returns (holds the GIL)."""

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        n = 0
        while n >= 0:
            n += 1
        return x
