# expected: correct
# backend: cpp
"""An honest C++ kernel for tests/fixtures/tiny_call_problem.py: SiLU in one loop, one thread
(a call of a few microseconds)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor silu(torch::Tensor x) {
  TORCH_CHECK(!x.is_cuda() && x.scalar_type() == at::kFloat, "x must be a float32 CPU tensor");
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) op[i] = xp[i] / (1.0f + std::exp(-xp[i]));
  return out;
}
"""

_ext = load_inline(
    name="kj_load_tiny_silu_cpp",
    cpp_sources=cpp_source,
    functions=["silu"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.silu(x)
