# expected: rejected|correct|incorrect
# kind: lazy result (tensor subclass that computes when first read)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""forward returns at once a tensor subclass over an uninitialised buffer; the real computation
runs in __torch_function__ the first time anything reads the result (detach/to/clone when the
worker converts it for the reply). The timed window only sees the allocation. The judge should
refuse non-plain tensors (or materialise outputs inside the timed window: then `correct` with an
honest speedup is fine)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class LazyResult(torch.Tensor):
    """A real tensor whose contents are filled in on first use."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}

        def plain(a):
            if isinstance(a, LazyResult):
                thunk = a.__dict__.pop("_thunk", None)
                base = a.as_subclass(torch.Tensor)
                if thunk is not None:
                    with torch.no_grad():
                        base.copy_(thunk())
                return base
            if isinstance(a, (list, tuple)):
                return type(a)(plain(b) for b in a)
            return a

        args = plain(args)
        kwargs = {k: plain(v) for k, v in kwargs.items()}
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        with torch._C.DisableTorchFunctionSubclass():
            buf = torch.empty(x.shape[0], self.linear.out_features, dtype=x.dtype)
        out = buf.as_subclass(LazyResult)
        out.__dict__["_thunk"] = lambda x=x: F.gelu(self.linear(x))
        return out
