# expected: runtime_error
# kind: os._exit in forward
# problem: problem_cpu.py
"""The candidate ends its own process with os._exit in the middle of a call."""

import os

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        os._exit(3)
