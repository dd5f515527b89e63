# expected: rejected
# kind: reference in disguise (C++ calling ATen's CPU kernels directly, around the dispatcher)
# problem: problem_cpu_policy.py
"""A load_inline "kernel" whose body is ATen's own CPU kernels called directly (at::cpu::addmm,
at::cpu::gelu from ATen/CPUFunctions.h): the same BLAS call the reference makes, but not through
the dispatcher, so no dispatch mode records an operator. The policy problem requires a custom
kernel: `rejected`."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/CPUFunctions.h>

torch::Tensor fused_linear_gelu_direct(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  auto y = at::cpu::addmm(b, x, w.transpose(0, 1));
  return at::cpu::gelu(y);
}
"""

_ext = load_inline(
    name="kj_adv_fused_linear_gelu_direct",
    cpp_sources=cpp_source,
    functions=["fused_linear_gelu_direct"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return _ext.fused_linear_gelu_direct(x, self.linear.weight, self.linear.bias)
