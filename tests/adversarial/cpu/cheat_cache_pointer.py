# expected: incorrect|correct|rejected
# kind: result cache keyed on the input's data pointer
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""Returns the cached result whenever an input arrives at an address seen before. The allocator
hands the same address back for a new tensor of the same size, so a later trial may get an
earlier trial's result (-> incorrect, caught), and timing calls (clones of one input alternating
between two addresses) become cache hits (-> a false speedup unless the judge catches it)."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.cache = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        out = F.gelu(self.linear(x))
        self.cache[key] = out
        return out
