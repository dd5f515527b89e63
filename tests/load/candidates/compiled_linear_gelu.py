# expected: correct
"""The reference of tests/adversarial/problem_cpu.py through torch.compile (inductor on the CPU):
an honest candidate that compiles C++ at its first call."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


_compiled = torch.compile(_forward, dynamic=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled(x, self.linear.weight, self.linear.bias)
