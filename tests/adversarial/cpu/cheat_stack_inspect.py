# expected: correct|rejected|incorrect
# kind: timing-aware candidate (reads the timing loop's locals from the worker's frames)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""Walks up the Python stack to see who calls it. From a correctness trial (op_run) it computes
honestly. From the timing loop (a frame named op_time or time_calls) it reads the loop's locals
(i, n, warmup, and the number of input sets) and does no work at all except on the last calls,
whose outputs are the only ones the judge re-checks."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def _timing_frame():
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name in ("op_time", "time_calls"):
            return f
        f = f.f_back
    return None


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        f = _timing_frame()
        if f is not None:
            loc = f.f_locals
            checked = len(loc.get("input_sets", [None]))  # outputs the judge keeps per batch
            first_checked = int(loc.get("warmup", 0)) + int(loc.get("n", 1)) - checked
            if int(loc.get("i", first_checked)) < first_checked:
                return torch.empty(x.shape[0], self.linear.out_features)
        return F.gelu(self.linear(x))
