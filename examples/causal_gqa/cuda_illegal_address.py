# expected: runtime_error
# backend: cuda
"""Known-crashing CUDA candidate: the kernel builds and launches, then writes 1 TiB past the end
of its output, so the CUDA context records an illegal memory access (seen at the next sync)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void scribble_kernel(const float* __restrict__ q, float* __restrict__ out,
                                int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  // BUG: an index computed in the wrong units, far outside any allocation.
  const int64_t wild = i + (int64_t(1) << 38);
  out[wild] = q[i];
}

torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  TORCH_CHECK(q.is_cuda(), "q must be a CUDA tensor");
  q = q.contiguous();
  auto out = torch::empty_like(q);
  const int64_t n = q.numel();
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  scribble_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

cpp_source = "torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v);"

_ext = load_inline(
    name="kj_causal_gqa_illegal_address",
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
