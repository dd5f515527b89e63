# expected: timeout
# backend: cpp
"""Known-hanging candidate: the C++ extension builds, then waits when called for a residual to
drop below zero, which halving never does (it stops at 0.0), so the call never returns."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor causal_gqa_cpu(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  // volatile: the compiler may not prove the loop endless and drop it.
  volatile double residual = 1.0;
  while (residual >= 0.0) residual = residual * 0.5;
  return q.clone();
}
"""

_ext = load_inline(
    name="kj_causal_gqa_cpp_hang",
    cpp_sources=cpp_source,
    functions=["causal_gqa_cpu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.causal_gqa_cpu(q, k, v)
