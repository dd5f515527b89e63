"""Does not compile: the C++ uses an undeclared identifier (num_groups) on line 22."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

torch::Tensor causal_gqa_cpu(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  TORCH_CHECK(!q.is_cuda(), "this candidate runs on the CPU");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, S, H, D)");
  q = q.contiguous().to(torch::kFloat);
  k = k.contiguous().to(torch::kFloat);
  v = v.contiguous().to(torch::kFloat);
  const int64_t B = q.size(0), S = q.size(1), Hq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(2);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "query heads must be a multiple of KV heads");
  const int64_t group = Hq / num_groups;
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));

  at::parallel_for(0, B * Hq, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> score(S), acc(D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hq, h = bh % Hq, hk = h / group;
      for (int64_t t = 0; t < S; ++t) {
        const float* qr = qp + ((b * S + t) * Hq + h) * D;
        double mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          const float* kr = kp + ((b * S + s) * Hkv + hk) * D;
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
          score[s] = dot * scale;
          mx = std::max(mx, score[s]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          score[s] = std::exp(score[s] - mx);
          sum += score[s];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t s = 0; s <= t; ++s) {
          const float* vr = vp + ((b * S + s) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += score[s] * vr[d];
        }
        float* orow = op + ((b * S + t) * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) orow[d] = static_cast<float>(acc[d] / sum);
      }
    }
  });
  return out;
}
"""

_ext = load_inline(
    name="kj_env_test_cpp_error",
    cpp_sources=cpp_source,
    functions=["causal_gqa_cpu"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.causal_gqa_cpu(q, k, v)
