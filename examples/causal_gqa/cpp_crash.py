# expected: runtime_error
# backend: cpp
"""Known-crashing candidate: the C++ extension builds, then writes through a null pointer when
called, so the process running it dies of SIGSEGV."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor causal_gqa_cpu(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  auto out = torch::empty_like(q);
  // The pointer is volatile so the compiler cannot prove it null and emit a trap instead of
  // the store: the store itself faults.
  float* volatile scratch = nullptr;
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) scratch[i] = q.data_ptr<float>()[i];
  return out;
}
"""

_ext = load_inline(
    name="kj_causal_gqa_cpp_crash",
    cpp_sources=cpp_source,
    functions=["causal_gqa_cpu"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.causal_gqa_cpu(q, k, v)
