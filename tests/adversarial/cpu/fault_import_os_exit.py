# expected: runtime_error|compile_error
# kind: os._exit at import time
# problem: problem_cpu.py
"""The candidate module ends the importing process: the build worker imports it first, so this
is a failed build (compile_error is an acceptable verdict, with a reason that says so)."""

import os

import torch.nn as nn

os._exit(7)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return x
