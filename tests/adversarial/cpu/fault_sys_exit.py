# expected: runtime_error
# kind: sys.exit in forward
# problem: problem_cpu.py
"""The candidate raises SystemExit (sys.exit) inside forward."""

import sys

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        sys.exit(0)
