# expected: incorrect
# kind: lower precision (operands rounded to 10-bit mantissas, like TF32; fp32 accumulation)
# problem: problem_cpu.py
"""Rounds x and W to TF32's 10 explicit mantissa bits (what a TF32 tensor-core GEMM does to its
operands) and multiplies in float32. The subtlest of the precision cheats: each product has a
relative error near 2^-11 instead of 2^-24."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _tf32(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int32)
    bits = (bits + 0x1000) & ~0x1FFF  # round to nearest on the 13 dropped mantissa bits
    return bits.view(torch.float32)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(F.linear(_tf32(x), _tf32(self.linear.weight), self.linear.bias))
