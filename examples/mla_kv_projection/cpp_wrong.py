# expected: incorrect
# backend: cpp
"""Known-wrong MLA projection: an off-by-one in the up-projection loop drops the last latent
dimension, so every key and value misses one rank-1 term. It compiles, runs and has the right
shape."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

torch::Tensor mla_kv_cpu(torch::Tensor hidden, torch::Tensor w_down, torch::Tensor w_up_k,
                         torch::Tensor w_up_v) {
  hidden = hidden.contiguous().to(torch::kFloat);
  w_down = w_down.contiguous().to(torch::kFloat);
  w_up_k = w_up_k.contiguous().to(torch::kFloat);
  w_up_v = w_up_v.contiguous().to(torch::kFloat);
  const int64_t B = hidden.size(0), S = hidden.size(1), M = hidden.size(2);
  const int64_t R = w_down.size(1), H = w_up_k.size(1);
  auto out = torch::empty({B, S, 2, H}, hidden.options());
  const float* hp = hidden.data_ptr<float>();
  const float* wd = w_down.data_ptr<float>();
  const float* wk = w_up_k.data_ptr<float>();
  const float* wv = w_up_v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::vector<float> latent(R);
  for (int64_t tok = 0; tok < B * S; ++tok) {
    const float* h = hp + tok * M;
    for (int64_t r = 0; r < R; ++r) {
      float acc = 0.f;
      for (int64_t m = 0; m < M; ++m) acc += h[m] * wd[m * R + r];
      latent[r] = acc;
    }
    float* o = op + tok * 2 * H;
    for (int64_t c = 0; c < H; ++c) {
      float k = 0.f, v = 0.f;
      for (int64_t r = 0; r < R - 1; ++r) {  // BUG: should run to R
        k += latent[r] * wk[r * H + c];
        v += latent[r] * wv[r * H + c];
      }
      o[c] = k;
      o[H + c] = v;
    }
  }
  return out;
}
"""

_ext = load_inline(
    name="kj_mla_kv_cpp_wrong",
    cpp_sources=cpp_source,
    functions=["mla_kv_cpu"],
    extra_cflags=["-O2"],
    verbose=False,
)


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
        out = _ext.mla_kv_cpu(hidden, w_down, w_up_k, w_up_v)
        B, S, _, HD = out.shape
        return out.view(B, S, 2, 4, HD // 4)
