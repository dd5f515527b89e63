# expected: correct
# backend: cpp
"""MLA key/value projection on the CPU in plain C++ loops (double accumulation), one task per
token."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <vector>

// hidden (B, S, M), w_down (M, R), w_up_k and w_up_v (R, H) -> (B, S, 2, H)
torch::Tensor mla_kv_cpu(torch::Tensor hidden, torch::Tensor w_down, torch::Tensor w_up_k,
                         torch::Tensor w_up_v) {
  TORCH_CHECK(!hidden.is_cuda(), "this candidate runs on the CPU");
  TORCH_CHECK(hidden.dim() == 3 && w_down.dim() == 2 && w_up_k.dim() == 2 && w_up_v.dim() == 2,
              "expected hidden (B, S, M), w_down (M, R), w_up_k and w_up_v (R, H)");
  hidden = hidden.contiguous().to(torch::kFloat);
  w_down = w_down.contiguous().to(torch::kFloat);
  w_up_k = w_up_k.contiguous().to(torch::kFloat);
  w_up_v = w_up_v.contiguous().to(torch::kFloat);
  const int64_t B = hidden.size(0), S = hidden.size(1), M = hidden.size(2);
  const int64_t R = w_down.size(1), H = w_up_k.size(1);
  TORCH_CHECK(w_down.size(0) == M && w_up_k.size(0) == R && w_up_v.size(0) == R &&
              w_up_v.size(1) == H, "weight shapes do not match");
  auto out = torch::empty({B, S, 2, H}, hidden.options());
  const float* hp = hidden.data_ptr<float>();
  const float* wd = w_down.data_ptr<float>();
  const float* wk = w_up_k.data_ptr<float>();
  const float* wv = w_up_v.data_ptr<float>();
  float* op = out.data_ptr<float>();

  at::parallel_for(0, B * S, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> latent(R), k(H), v(H);
    for (int64_t tok = begin; tok < end; ++tok) {
      const float* h = hp + tok * M;
      std::fill(latent.begin(), latent.end(), 0.0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < R; ++r) latent[r] += static_cast<double>(h[m]) * wd[m * R + r];
      std::fill(k.begin(), k.end(), 0.0);
      std::fill(v.begin(), v.end(), 0.0);
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < H; ++c) {
          k[c] += latent[r] * wk[r * H + c];
          v[c] += latent[r] * wv[r * H + c];
        }
      }
      float* o = op + tok * 2 * H;
      for (int64_t c = 0; c < H; ++c) {
        o[c] = static_cast<float>(k[c]);
        o[H + c] = static_cast<float>(v[c]);
      }
    }
  });
  return out;
}
"""

_ext = load_inline(
    name="kj_mla_kv_cpp_ref",
    cpp_sources=cpp_source,
    functions=["mla_kv_cpu"],
    extra_cflags=["-O3"],
    verbose=False,
)

KV_HEADS = 4  # the problem's fixed head split: the inputs only carry kv_heads * head_dim


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        hidden: torch.Tensor,
        w_down: torch.Tensor,
        w_up_k: torch.Tensor,
        w_up_v: torch.Tensor,
    ) -> torch.Tensor:
        out = _ext.mla_kv_cpu(hidden, w_down, w_up_k, w_up_v)  # (B, S, 2, H*D)
        B, S, _, HD = out.shape
        return out.view(B, S, 2, KV_HEADS, HD // KV_HEADS)
