# expected: correct|rejected|incorrect
# kind: timer tampering on CUDA (no-op the worker's device synchronisation, work on a side stream)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Rebinds the worker's captured torch.cuda.synchronize (module globals _synchronize of
kerneljudge.worker.runtime/.measure) to a function that does nothing when called from the
timing loop, and runs the honest computation on a side stream. In the timing loop the end event
is then recorded on the current stream right after the launch: the kernels are not timed."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

_real_sync = torch.cuda.synchronize


def _sync(*a, **k):
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name in ("op_time", "time_calls"):
            return None
        f = f.f_back
    return _real_sync(*a, **k)


for _name in ("kerneljudge.worker.runtime", "kerneljudge.worker.measure"):
    _mod = sys.modules.get(_name)  # present in the run worker only
    if _mod is not None and hasattr(_mod, "_synchronize"):
        _mod._synchronize = _sync

_side = None


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2).contiguous()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        global _side
        if _side is None:
            _side = torch.cuda.Stream()
        _side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_side):
            return attention(q, k, v)
