# expected: rejected
# kind: reference in disguise (a C++ "kernel" that calls at::linear and at::gelu)
# problem: problem_cpu_policy.py
"""A load_inline extension whose body is the reference's ATen ops (at::linear, at::gelu): a
custom kernel in name only. The policy problem requires a custom kernel: `rejected`."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor fused_linear_gelu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  return at::gelu(at::linear(x, w, b));
}
"""

_ext = load_inline(
    name="kj_adv_fused_linear_gelu_aten",
    cpp_sources=cpp_source,
    functions=["fused_linear_gelu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return _ext.fused_linear_gelu(x, self.linear.weight, self.linear.bias)
