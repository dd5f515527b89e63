# expected: rejected
# kind: reference in disguise: inherits Model through an alias, runs it unrecorded
# problem: problem_cpu_policy.py
"""ModelNew derives from the problem's Model through an alias (`_Base = ...; class
ModelNew(_Base)`), imported by path without an import statement naming the problem, so a check
of the syntax tree for `ModelNew(Model)` misses it. Its forward is Model.forward, run under
torch._C._DisableTorchDispatch() so no dispatch mode sees the operators. The word load_inline in
this docstring makes the text-based backend detection call it `cpp`. Expected: `rejected`."""

import importlib.util
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def _reference_model():
    path = os.path.join(os.environ.get("KJ_ADV_ROOT", ""), "problem_cpu_policy.py")
    if os.path.isfile(path):
        spec = importlib.util.spec_from_file_location("kj_adv_reference_problem", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.Model

    class Model(nn.Module):  # a verbatim copy, when the problem file is out of reach
        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)

        def forward(self, x):
            return F.gelu(self.linear(x))

    return Model


_Base = _reference_model()


class ModelNew(_Base):
    def forward(self, x):
        with torch._C._DisableTorchDispatch():
            return super().forward(x)
