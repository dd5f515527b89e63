# expected: rejected|incorrect
# kind: work moved out of the timed windows (the next call's outputs computed before its start mark)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""The timing loop in the candidate's own process prepares each call's inputs with the module
global ``perturb`` of kerneljudge.worker.measure, after the call's seed arrived and before its
start mark. The candidate rebinds it: the wrapper makes the inputs, computes the model's output
on them at once (outside any timed window), and leaves it for ``forward``, which returns it in
no time. Every output is right; every timed call is almost empty. Only the time between calls,
on the kernel's clock and in the kernel's count of the worker's CPU time, shows the work."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

_ready: dict[int, torch.Tensor] = {}
_model: list[nn.Module] = []


def _install() -> None:
    mod = sys.modules.get("kerneljudge.worker.measure")  # present in the run worker only
    if mod is None or getattr(mod, "_kj_precompute", False):
        return
    real = mod.perturb

    def perturb(args, which, seed, roll=True, **kw):
        out = real(args, which, seed, roll, **kw)
        if _model and out and isinstance(out[0], torch.Tensor):
            with torch.no_grad():
                _ready[out[0].data_ptr()] = _model[0].compute(out[0])
        return out

    mod.perturb = perturb
    mod._kj_precompute = True


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        _model[:] = [self]
        _install()

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        done = _ready.pop(x.data_ptr(), None)
        return done if done is not None else self.compute(x)
