# expected: correct
# backend: cpp
"""Triangle attention on the CPU: the whole forward (LayerNorm, projections, masked softmax with
pair bias, gate, output projection) in plain C++ loops with double accumulation."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

namespace {

const float* f32(const torch::Tensor& t) { return t.data_ptr<float>(); }

// y[t, o] = sum_c x[t, c] * w[o, c] (+ b[o]) for t < T, o < O, c < C; x and y are double.
void linear(const std::vector<double>& x, const float* w, const float* b, std::vector<double>& y,
            int64_t T, int64_t C, int64_t O) {
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t o = 0; o < O; ++o) {
        double acc = b ? b[o] : 0.0;
        for (int64_t c = 0; c < C; ++c) acc += x[t * C + c] * w[o * C + c];
        y[t * O + o] = acc;
      }
    }
  });
}

}  // namespace

torch::Tensor triangle_attention_cpu(torch::Tensor z, torch::Tensor mask, torch::Tensor ln_w,
                                     torch::Tensor ln_b, double eps, torch::Tensor wq,
                                     torch::Tensor wk, torch::Tensor wv, torch::Tensor wg,
                                     torch::Tensor bg, torch::Tensor wb, torch::Tensor wo,
                                     torch::Tensor bo, int64_t heads) {
  TORCH_CHECK(!z.is_cuda(), "this candidate runs on the CPU");
  TORCH_CHECK(z.dim() == 4 && z.size(1) == z.size(2), "pair_repr must be (B, N, N, D)");
  auto prep = [](const torch::Tensor& t) { return t.detach().contiguous().to(torch::kFloat); };
  z = prep(z); mask = prep(mask); ln_w = prep(ln_w); ln_b = prep(ln_b);
  wq = prep(wq); wk = prep(wk); wv = prep(wv); wg = prep(wg); bg = prep(bg);
  wb = prep(wb); wo = prep(wo); bo = prep(bo);
  const int64_t B = z.size(0), N = z.size(1), D = z.size(3), T = B * N * N;
  TORCH_CHECK(heads > 0 && D % heads == 0, "pair_dim must be a multiple of heads");
  const int64_t dh = D / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));

  // LayerNorm over the last axis (biased variance, as torch).
  std::vector<double> x(T * D);
  const float* zp = f32(z);
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      double mean = 0.0, var = 0.0;
      for (int64_t c = 0; c < D; ++c) mean += zp[t * D + c];
      mean /= D;
      for (int64_t c = 0; c < D; ++c) {
        const double dev = zp[t * D + c] - mean;
        var += dev * dev;
      }
      const double inv = 1.0 / std::sqrt(var / D + eps);
      for (int64_t c = 0; c < D; ++c)
        x[t * D + c] = (zp[t * D + c] - mean) * inv * f32(ln_w)[c] + f32(ln_b)[c];
    }
  });

  std::vector<double> q(T * D), k(T * D), v(T * D), g(T * D), pb(T * heads);
  linear(x, f32(wq), nullptr, q, T, D, D);
  linear(x, f32(wk), nullptr, k, T, D, D);
  linear(x, f32(wv), nullptr, v, T, D, D);
  linear(x, f32(wg), f32(bg), g, T, D, D);
  linear(x, f32(wb), nullptr, pb, T, D, heads);

  // Row (b, i): entry j attends over entries kk of the same row with bias pb[b, j, kk, head];
  // keys with mask[b, j, kk] == 0 get no weight. The result is gated by sigmoid(g).
  std::vector<double> gated(T * D);
  const float* mp = f32(mask);
  at::parallel_for(0, B * N, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> p(N);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / N;
      for (int64_t head = 0; head < heads; ++head) {
        for (int64_t j = 0; j < N; ++j) {
          const double* qr = &q[(row * N + j) * D + head * dh];
          double mx = -INFINITY;
          for (int64_t kk = 0; kk < N; ++kk) {
            if (mp[(b * N + j) * N + kk] == 0.f) {
              p[kk] = -INFINITY;
              continue;
            }
            const double* kr = &k[(row * N + kk) * D + head * dh];
            double dot = 0.0;
            for (int64_t d = 0; d < dh; ++d) dot += qr[d] * kr[d];
            p[kk] = dot * scale + pb[((b * N + j) * N + kk) * heads + head];
            mx = std::max(mx, p[kk]);
          }
          double sum = 0.0;
          for (int64_t kk = 0; kk < N; ++kk) {
            p[kk] = p[kk] == -INFINITY ? 0.0 : std::exp(p[kk] - mx);
            sum += p[kk];
          }
          for (int64_t d = 0; d < dh; ++d) {
            const double* vc = &v[row * N * D + head * dh + d];  // column d of this row's v
            double acc = 0.0;
            for (int64_t kk = 0; kk < N; ++kk) acc += p[kk] * vc[kk * D];
            const int64_t idx = (row * N + j) * D + head * dh + d;
            gated[idx] = acc / sum / (1.0 + std::exp(-g[idx]));
          }
        }
      }
    }
  });

  std::vector<double> y(T * D);
  linear(gated, f32(wo), f32(bo), y, T, D, D);
  auto out = torch::empty({B, N, N, D}, z.options());
  float* op = out.data_ptr<float>();
  for (int64_t i = 0; i < T * D; ++i) op[i] = static_cast<float>(y[i]);
  return out;
}
"""

_ext = load_inline(
    name="kj_triangle_attention_cpp_ref",
    cpp_sources=cpp_source,
    functions=["triangle_attention_cpu"],
    extra_cflags=["-O3"],
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
        return _ext.triangle_attention_cpu(
            pair_repr, pair_mask, self.layer_norm.weight, self.layer_norm.bias,
            self.layer_norm.eps, self.query.weight, self.key.weight, self.value.weight,
            self.gate.weight, self.gate.bias, self.bias_proj.weight, self.out_proj.weight,
            self.out_proj.bias, self.num_heads,
        )
