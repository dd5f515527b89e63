# expected: runtime_error
# backend: cpp
"""Known-failing candidate: the forward hands the C++ extension the up-projection weight where
the down-projection belongs, so the extension's shape check raises on every call."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KV_HEADS = 4

cpp_source = r"""
#include <torch/extension.h>

// hidden (B, S, M), w_down (M, R), w_up_k and w_up_v (R, H) -> (B, S, 2, H)
torch::Tensor mla_kv_cpu(torch::Tensor hidden, torch::Tensor w_down, torch::Tensor w_up_k,
                         torch::Tensor w_up_v) {
  const int64_t B = hidden.size(0), S = hidden.size(1), M = hidden.size(2);
  const int64_t R = w_down.size(1), H = w_up_k.size(1);
  TORCH_CHECK(w_down.size(0) == M && w_up_k.size(0) == R && w_up_v.size(0) == R,
              "weight shapes do not match: w_down is ", w_down.sizes(), " for hidden size ", M);
  hidden = hidden.contiguous().to(torch::kFloat);
  w_down = w_down.contiguous().to(torch::kFloat);
  w_up_k = w_up_k.contiguous().to(torch::kFloat);
  w_up_v = w_up_v.contiguous().to(torch::kFloat);
  auto out = torch::zeros({B, S, 2, H}, hidden.options());
  const float* hp = hidden.data_ptr<float>();
  const float* wd = w_down.data_ptr<float>();
  const float* wk = w_up_k.data_ptr<float>();
  const float* wv = w_up_v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::vector<double> latent(R);
  for (int64_t tok = 0; tok < B * S; ++tok) {
    std::fill(latent.begin(), latent.end(), 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < R; ++r) latent[r] += double(hp[tok * M + m]) * wd[m * R + r];
    for (int64_t j = 0; j < H; ++j) {
      double k = 0.0, v = 0.0;
      for (int64_t r = 0; r < R; ++r) {
        k += latent[r] * wk[r * H + j];
        v += latent[r] * wv[r * H + j];
      }
      op[(tok * 2) * H + j] = float(k);
      op[(tok * 2 + 1) * H + j] = float(v);
    }
  }
  return out;
}
"""

_ext = load_inline(
    name="kj_mla_kv_cpp_raises",
    cpp_sources=cpp_source,
    functions=["mla_kv_cpu"],
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
        out = _ext.mla_kv_cpu(hidden, w_up_k, w_up_k, w_up_v)  # BUG: w_up_k for w_down
        B, S, _, HD = out.shape
        return out.view(B, S, 2, KV_HEADS, HD // KV_HEADS)
