# expected: timeout
# backend: torch
"""Known-hanging candidate: plain PyTorch whose forward never returns (a Python busy loop)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        steps = 0
        while steps >= 0:  # always true: waits for a convergence that never comes
            steps += 1
        return q
