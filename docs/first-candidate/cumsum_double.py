"""my_cumsum.py passing float64 to its kernel, which takes float32: a runtime_error."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>

torch::Tensor row_cumsum(torch::Tensor x) {
  TORCH_CHECK(x.device().is_cpu(), "this kernel runs on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be a 2-D float32 tensor");
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  const float* in = x.data_ptr<float>();
  float* res = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        sum += in[r * cols + c];
        res[r * cols + c] = static_cast<float>(sum);
      }
    }
  });
  return out;
}
"""

ext = load_inline(name="cumsum_double", cpp_sources=[cpp_source], functions=["row_cumsum"])


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.row_cumsum(x.double())
