# expected: compile_error
# backend: cuda
# compile-error-line: 28
"""Known-broken CUDA candidate: the kernel reads `rank_dim`, a name it never declares (the
parameter is `R`), so nvcc rejects it. The declared line is the one nvcc points at."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// One thread per (token, output column): recomputes the token's latent, then one column of k|v.
__global__ void mla_kv_kernel(const float* __restrict__ hidden, const float* __restrict__ w_down,
                              const float* __restrict__ w_up_k, const float* __restrict__ w_up_v,
                              float* __restrict__ out, int64_t T, int M, int R, int H) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= T * 2 * H) return;
  const int64_t tok = idx / (2 * H);
  const int c = idx % (2 * H);
  const float* w = c < H ? w_up_k + c : w_up_v + (c - H);
  float acc = 0.f;
  for (int r = 0; r < R; ++r) {
    float lat = 0.f;
    for (int m = 0; m < M; ++m) lat += hidden[tok * M + m] * w_down[m * rank_dim + r];
    acc += lat * w[r * H];
  }
  out[idx] = acc;
}

torch::Tensor mla_kv_forward(torch::Tensor hidden, torch::Tensor w_down, torch::Tensor w_up_k,
                             torch::Tensor w_up_v) {
  hidden = hidden.contiguous();
  const int64_t B = hidden.size(0), S = hidden.size(1);
  const int M = hidden.size(2), R = w_down.size(1), H = w_up_k.size(1);
  auto out = torch::empty({B, S, 2, H}, hidden.options());
  const int64_t n = B * S * 2 * H;
  const int blocks = static_cast<int>((n + 255) / 256);
  mla_kv_kernel<<<blocks, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      hidden.data_ptr<float>(), w_down.data_ptr<float>(), w_up_k.data_ptr<float>(),
      w_up_v.data_ptr<float>(), out.data_ptr<float>(), B * S, M, R, H);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

cpp_source = (
    "torch::Tensor mla_kv_forward(torch::Tensor hidden, torch::Tensor w_down, "
    "torch::Tensor w_up_k, torch::Tensor w_up_v);"
)

_ext = load_inline(
    name="kj_mla_kv_compile_error",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mla_kv_forward"],
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
        out = _ext.mla_kv_forward(hidden, w_down, w_up_k, w_up_v)
        B, S, _, HD = out.shape
        return out.view(B, S, 2, 4, HD // 4)
