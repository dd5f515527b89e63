# expected: rejected
# kind: reference in disguise, past both policy checks (backend by a comment; ops unrecorded)
# problem: problem_cpu_policy.py
"""No custom kernel at all. The static check decides the backend from the text: the word
load_inline in this docstring (nothing calls it) makes this a `cpp` candidate. The dynamic check
records ATen operators with a TorchDispatchMode; forward runs F.linear and F.gelu under
torch._C._DisableTorchDispatch(), which hides them from every Python dispatch mode. The policy
problem requires a custom kernel: `rejected`."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        with torch._C._DisableTorchDispatch():
            return F.gelu(F.linear(x, self.linear.weight, self.linear.bias))
