# expected: rejected
# kind: reference in disguise (ModelNew inherits the problem's Model)
# problem: problem_cpu_policy.py
"""`class ModelNew(Model): pass`, with Model imported from the problem file (found through
KJ_ADV_ROOT, which run_suite.py sets; else a verbatim copy of the reference class). The policy
problem requires a custom kernel: `rejected`."""

import importlib.util
import os

import torch.nn as nn
import torch.nn.functional as F

_path = os.path.join(os.environ.get("KJ_ADV_ROOT", ""), "problem_cpu_policy.py")
if os.path.isfile(_path):
    _spec = importlib.util.spec_from_file_location("kj_adv_reference_problem", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    Model = _mod.Model
else:

    class Model(nn.Module):
        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)

        def forward(self, x):
            return F.gelu(self.linear(x))


class ModelNew(Model):
    pass
