# expected: runtime_error
# kind: host out-of-memory (one 64 GiB allocation)
# problem: problem_cpu.py
"""Asks for 64 GiB at once. Under the kernel's heuristic overcommit (mode 0) this fails at
once; if the allocation is granted without being touched (overcommit mode 1), the candidate
raises MemoryError itself rather than touch it, so that the suite never exhausts the machine."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        big = torch.empty(64 << 30, dtype=torch.uint8)  # fails here under overcommit mode 0
        del big
        raise MemoryError("64 GiB were granted untouched (overcommit); not touching them")
