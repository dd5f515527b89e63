# expected: runtime_error
# backend: cpp
"""Known-failing triangle attention: the forward hands the C++ attention core the pair bias in
its (B, N, N, heads) layout, not permuted to (B, heads, N, N), so the core's shape check raises
on every call. The projections are plain PyTorch."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// q, k, v (B*N, h, N, d); bias (B, h, N, N); mask (B, N, N) -> (B*N, h, N, d)
torch::Tensor attention_core(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                             torch::Tensor bias, torch::Tensor mask) {
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous();
  bias = bias.contiguous(); mask = mask.contiguous().to(torch::kFloat);
  const int64_t BN = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t B = BN / N;
  TORCH_CHECK(bias.dim() == 4 && bias.size(0) == B && bias.size(1) == H && bias.size(2) == N &&
              bias.size(3) == N, "bias must be (B, heads, N, N), got ", bias.sizes());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, BN * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> p(N);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t row = bh / H, head = bh % H, b = row / N;
      const int64_t base = bh * N * d;
      for (int64_t j = 0; j < N; ++j) {
        double mx = -INFINITY;
        for (int64_t kk = 0; kk < N; ++kk) {
          if (mp[(b * N + j) * N + kk] == 0.f) { p[kk] = -INFINITY; continue; }
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(qp[base + j * d + c]) * kp[base + kk * d + c];
          p[kk] = dot * scale + bp[((b * H + head) * N + j) * N + kk];
          mx = std::max(mx, p[kk]);
        }
        double sum = 0.0;
        for (int64_t kk = 0; kk < N; ++kk) {
          p[kk] = p[kk] == -INFINITY ? 0.0 : std::exp(p[kk] - mx);
          sum += p[kk];
        }
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (int64_t kk = 0; kk < N; ++kk) acc += p[kk] * vp[base + kk * d + c];
          op[base + j * d + c] = static_cast<float>(acc / sum);
        }
      }
    }
  });
  return out;
}
"""

_ext = load_inline(
    name="kj_triangle_attention_cpp_raises",
    cpp_sources=cpp_source,
    functions=["attention_core"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, pair_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = pair_dim // num_heads
        self.layer_norm = nn.LayerNorm(pair_dim)
        self.query = nn.Linear(pair_dim, pair_dim, bias=False)
        self.key = nn.Linear(pair_dim, pair_dim, bias=False)
        self.value = nn.Linear(pair_dim, pair_dim, bias=False)
        self.gate = nn.Linear(pair_dim, pair_dim)
        self.bias_proj = nn.Linear(pair_dim, num_heads, bias=False)
        self.out_proj = nn.Linear(pair_dim, pair_dim)

    def forward(self, pair_repr: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        B, N, _, D = pair_repr.shape
        h, d = self.num_heads, self.head_dim
        x = self.layer_norm(pair_repr)
        g = torch.sigmoid(self.gate(x))
        bias = self.bias_proj(x)  # BUG: (B, N, N, h), never permuted to (B, h, N, N)
        x_flat = x.reshape(B * N, N, D)
        q = self.query(x_flat).view(B * N, N, h, d).transpose(1, 2)
        k = self.key(x_flat).view(B * N, N, h, d).transpose(1, 2)
        v = self.value(x_flat).view(B * N, N, h, d).transpose(1, 2)
        out = _ext.attention_core(q, k, v, bias, pair_mask)  # (B*N, h, N, d)
        out = out.transpose(1, 2).reshape(B, N, N, D)
        return self.out_proj(g * out)
