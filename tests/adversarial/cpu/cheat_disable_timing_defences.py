# expected: correct|rejected|incorrect
# kind: switching off the timing loop's in-process defences (input nudge, memory poison)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""The timing loop runs in the candidate's process, so its helpers are the candidate's to
rebind: kerneljudge.worker.measure.nudge and .poison (and the nudge perturb calls, in
kerneljudge.worker.perturbation) become no-ops, and the draw that picks timed calls for checking
(_randbelow) never picks one. With the timed inputs equal to the trial inputs again, an exact
content cache answers every timed call."""

import sys

import torch.nn as nn
import torch.nn.functional as F

_measure = sys.modules.get("kerneljudge.worker.measure")
if _measure is not None:
    _measure.nudge = lambda *a, **k: None
    _measure.poison = lambda *a, **k: None
    if hasattr(_measure, "_randbelow"):  # no random audits of timed outputs
        _measure._randbelow = lambda n: n - 1
_perturbation = sys.modules.get("kerneljudge.worker.perturbation")
if _perturbation is not None:
    _perturbation.nudge = lambda *a, **k: None


def _fingerprint(x):
    flat = x.reshape(-1)
    n = flat.numel()
    return (tuple(x.shape),) + tuple(float(flat[i]) for i in (0, 1, n // 3, n // 2, n - 2, n - 1))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.cache = {}

    def forward(self, x):
        key = _fingerprint(x)
        if key not in self.cache:
            self.cache[key] = F.gelu(self.linear(x))
        return self.cache[key]
