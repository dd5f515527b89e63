# expected: incorrect
# kind: uninitialised output (torch.empty, never written)
# problem: problem_cpu.py
"""Returns torch.empty of the right shape and dtype. The reference runs in another process, so
its freed buffers are out of reach; whatever the allocator returns here is garbage or zeros or
this process's own old data for other inputs. Must be `incorrect`."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.empty(x.shape[0], self.linear.out_features)
