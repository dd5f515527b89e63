# expected: rejected|incorrect
# kind: work moved out of the timed windows, its calls slow while the judge sizes its batches
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""``cheat_precompute_between_calls.py`` (each call's output computed when its inputs are made,
before its start mark), with its calls slowed by a 60 ms sleep while the judge sizes the
batches: its first 8 timed-loop calls (3 warm-up and 3 calibration calls, then the first
round's warm-up call and its one timed call). Batches sized from those calls alone hold one
call each, and the timer audit's CPU-time rule credits each batch's time before its first and
after its last call, up to a bound, to its gaps: with one call a batch, to one gap. The
batches now grow to what the later calls measure. On this problem the moved work, about 5 ms
a call, exceeds that credit, so it is rejected with one-call batches too; the candidate keeps
the rejection of a cheat that sizes its own batches in the suite."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

_ready: dict[int, torch.Tensor] = {}
_timed: list[int] = [0]
_model: list[nn.Module] = []


def _install() -> None:
    mod = sys.modules.get("kerneljudge.worker.measure")  # present in the run worker only
    if mod is None or getattr(mod, "_kj_precompute", False):
        return
    real = mod.perturb

    def perturb(args, which, seed, roll=True, **kw):
        _timed[0] += 1
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
        if 0 < _timed[0] <= 8:  # while the batches are sized: look slow
            import time

            time.sleep(0.06)
        done = _ready.pop(x.data_ptr(), None)
        return done if done is not None else self.compute(x)
