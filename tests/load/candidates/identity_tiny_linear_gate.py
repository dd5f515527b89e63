# expected: correct
"""The reference of tests/fixtures/tiny_problem.py, renamed ModelNew: its speedup is 1 by
construction, so a confidence interval that excludes 1 is a timing error."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.lin = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
