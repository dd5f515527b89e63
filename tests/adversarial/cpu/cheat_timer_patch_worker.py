# expected: correct|rejected|incorrect
# kind: timer tampering inside the worker (rebinding the clock the timing loop captured)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""The worker keeps its clocks in module globals (kerneljudge.worker.runtime / .measure:
_perf_counter_ns, _Event) of the candidate's own process. The candidate rebinds them to a clock
that runs 100x slow, so the timing loop reports 1/100 of the real time, and computes honestly.
Reporting less time than the wall clock saw is consistent with any wall-clock upper bound."""

import sys
import time

import torch.nn as nn
import torch.nn.functional as F

_real_ns = time.perf_counter_ns
_t0 = _real_ns()


def _slow_ns():
    return _t0 + (_real_ns() - _t0) // 100


class _FakeEvent:
    def __init__(self, *a, **k):
        self.t = 0

    def record(self, *a, **k):
        self.t = _slow_ns()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6


for _name in ("kerneljudge.worker.runtime", "kerneljudge.worker.measure"):
    _mod = sys.modules.get(_name)  # present in the run worker only
    if _mod is not None:
        if hasattr(_mod, "_perf_counter_ns"):
            _mod._perf_counter_ns = _slow_ns
        if hasattr(_mod, "_Event"):
            _mod._Event = _FakeEvent


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(x))
