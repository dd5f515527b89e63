# expected: rejected
# kind: reference in disguise (custom kernel that always fails, PyTorch fallback in `except`)
# problem: problem_cpu_policy.py
"""Builds a C++ extension whose entry point refuses these shapes (it "needs" a batch divisible
by 256), and falls back to F.linear + F.gelu in an `except`. Every call runs the fallback: the
reference's ops. The policy problem requires a custom kernel: `rejected`."""

import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor linear_gelu_tiled(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.size(0) % 256 == 0, "linear_gelu_tiled: batch must be a multiple of 256");
  TORCH_CHECK(false, "linear_gelu_tiled: not implemented yet");
  return x;
}
"""

_ext = load_inline(
    name="kj_adv_linear_gelu_tiled_stub",
    cpp_sources=cpp_source,
    functions=["linear_gelu_tiled"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        try:
            return _ext.linear_gelu_tiled(x, self.linear.weight, self.linear.bias)
        except RuntimeError:
            return F.gelu(F.linear(x, self.linear.weight, self.linear.bias))
