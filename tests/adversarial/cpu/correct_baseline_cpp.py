# expected: correct
# kind: correct baseline with a custom C++ kernel (for the policy problem)
# problem: problem_cpu_policy.py
"""KJ-ADV-BASELINE-CPP. An honest custom CPU kernel: Linear + exact GELU in plain C++ loops
(double accumulation, rows in parallel). Slower than the reference's BLAS, but a real kernel: the
policy problem must accept it. Judged after every candidate on the policy problem."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

torch::Tensor linear_gelu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(!x.is_cuda() && x.scalar_type() == at::kFloat, "x must be a float32 CPU tensor");
  x = x.contiguous(); w = w.contiguous(); b = b.contiguous();
  const int64_t B = x.size(0), K = x.size(1), N = w.size(0);
  auto out = torch::empty({B, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * K;
      for (int64_t n = 0; n < N; ++n) {
        const float* wr = wp + n * K;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8)
          for (int j = 0; j < 8; ++j) acc[j] += (double)xr[k + j] * (double)wr[k + j];
        double s = 0;
        for (; k < K; ++k) s += (double)xr[k] * (double)wr[k];
        for (int j = 0; j < 8; ++j) s += acc[j];
        s += bp[n];
        op[r * N + n] = (float)(0.5 * s * (1.0 + std::erf(s * 0.70710678118654752440)));
      }
    }
  });
  return out;
}
"""

_ext = load_inline(
    name="kj_adv_linear_gelu_cpp",
    cpp_sources=cpp_source,
    functions=["linear_gelu"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return _ext.linear_gelu(x, self.linear.weight, self.linear.bias)
