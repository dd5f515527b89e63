# expected: correct
# kind: correct baseline (same ops as the reference)
# problem: problem_cpu.py
"""KJ-ADV-BASELINE. An honest candidate: the reference's own computation. Judged after every
faulty or cheating candidate (``--interleave``) to show the judge is still healthy."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x))
