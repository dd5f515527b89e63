# expected: incorrect
# kind: lower precision (bfloat16 compute, cast back to float32)
# problem: problem_cpu.py
"""Computes the Linear and GELU in bfloat16 and returns float32. The problem states float32."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w, b = self.linear.weight.bfloat16(), self.linear.bias.bfloat16()
        return F.gelu(F.linear(x.bfloat16(), w, b)).float()
