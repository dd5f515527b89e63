# expected: compile_error
# backend: cuda
# compile-error-line: 33
"""Known-broken CUDA candidate: the kernel uses an identifier it never declares (`head_dim`),
so nvcc rejects it. The declared line is the one in this file that nvcc points at."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cmath>

__global__ void causal_gqa_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                  const float* __restrict__ v, float* __restrict__ out,
                                  int S, int Hq, int Hkv, int D) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  if (t >= S) return;
  const int hk = h / (Hq / Hkv);
  const float* qr = q + ((int64_t)(b * S + t) * Hq + h) * D;
  float m = -INFINITY, l = 0.f;
  float acc[128];
  for (int d = 0; d < D; ++d) acc[d] = 0.f;
  for (int s = 0; s <= t; ++s) {
    const float* kr = k + ((int64_t)(b * S + s) * Hkv + hk) * D;
    const float* vr = v + ((int64_t)(b * S + s) * Hkv + hk) * D;
    float dot = 0.f;
    for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
    dot *= rsqrtf((float)head_dim);
    const float m_new = fmaxf(m, dot);
    const float alpha = expf(m - m_new), p = expf(dot - m_new);
    l = l * alpha + p;
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * alpha + p * vr[d];
    m = m_new;
  }
  float* orow = out + ((int64_t)(b * S + t) * Hq + h) * D;
  for (int d = 0; d < D; ++d) orow[d] = acc[d] / l;
}

torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  q = q.contiguous();
  k = k.contiguous();
  v = v.contiguous();
  auto out = torch::empty_like(q);
  const int S = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  const dim3 grid((S + 127) / 128, Hq, q.size(0));
  causal_gqa_kernel<<<grid, 128, 0, c10::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
      S, Hq, Hkv, D);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

cpp_source = "torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v);"

_ext = load_inline(
    name="kj_causal_gqa_compile_error",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["causal_gqa_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.causal_gqa_forward(q, k, v)
