# expected: runtime_error
# kind: segfault (SIGSEGV) in forward
# problem: problem_cpu.py
"""Dereferences address 0 through ctypes: the process gets SIGSEGV, like a crashing extension."""

import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        ctypes.string_at(0)
        return x
