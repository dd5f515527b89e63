# expected: correct|rejected|incorrect
# kind: partial writes into a stale output buffer (only during timing)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""Like cheat_stale_memory, but writes half of the rows (a smaller problem) into the stale
buffer during timing, so the timed call does half of the work; the other half of the buffer
still holds the right values from an earlier identical call."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _fingerprint(x):
    flat = x.reshape(-1)
    n = flat.numel()
    return (tuple(x.shape),) + tuple(float(flat[i]) for i in (0, n // 2, n - 1))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.last_key = None
        self.ptrs = set()

    def forward(self, x):
        key = _fingerprint(x)
        if key == self.last_key:
            keep = []
            for _ in range(4):
                buf = torch.empty(x.shape[0], self.linear.out_features)
                # one of our own old output blocks, not overwritten since (e.g. by a
                # judge that poisons freed memory with NaN)
                if buf.data_ptr() in self.ptrs and bool(torch.isfinite(buf[-1, -8:]).all()):
                    half = x.shape[0] // 2
                    buf[:half] = F.gelu(self.linear(x[:half]))
                    return buf
                keep.append(buf)
        else:
            self.ptrs.clear()
        self.last_key = key
        out = F.gelu(self.linear(x))
        self.ptrs.add(out.data_ptr())
        return out
