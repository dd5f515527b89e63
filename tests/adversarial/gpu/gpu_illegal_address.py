# expected: runtime_error
# kind: CUDA illegal memory access (the CUDA context is poisoned)
# problem: ../fixtures/causal_gqa_any_kernel.py
"""A kernel that writes 1 TiB past its output. The launch succeeds; the error surfaces at the
next synchronisation, and the worker's CUDA context is unusable afterwards: the judge must give
runtime_error and judge the next candidate on a fresh worker."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void kj_adv_wild_write(const float* __restrict__ q, float* __restrict__ out, int64_t n) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i + (int64_t(1) << 38)] = q[i];
}

torch::Tensor wild_write(torch::Tensor q) {
  TORCH_CHECK(q.is_cuda(), "q must be a CUDA tensor");
  q = q.contiguous();
  auto out = torch::empty_like(q);
  const int64_t n = q.numel();
  kj_adv_wild_write<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

_ext = load_inline(
    name="kj_adv_gpu_illegal_address",
    cpp_sources="torch::Tensor wild_write(torch::Tensor q);",
    cuda_sources=cuda_source,
    functions=["wild_write"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return _ext.wild_write(q)
