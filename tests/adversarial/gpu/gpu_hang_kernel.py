# expected: timeout
# kind: a kernel that never ends on the GPU
# problem: ../fixtures/causal_gqa_any_kernel.py
"""A kernel that spins on a flag in device memory that nobody ever sets. The host blocks in the
synchronisation after the call; only killing the worker ends it. The judge must give timeout,
and the GPU must be usable by the next candidate (and by the reference)."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void kj_adv_spin_forever(const int* flag, float* out) {
  // `flag` is zero and nothing writes it: this loop never ends.
  while (*(volatile const int*)flag == 0) {
    __nanosleep(1000);
  }
  out[threadIdx.x] = 1.0f;
}

torch::Tensor spin(torch::Tensor q) {
  TORCH_CHECK(q.is_cuda(), "q must be a CUDA tensor");
  auto flag = torch::zeros({1}, q.options().dtype(torch::kInt32));
  auto out = torch::empty_like(q);
  kj_adv_spin_forever<<<1, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      flag.data_ptr<int>(), out.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

_ext = load_inline(
    name="kj_adv_gpu_spin_forever",
    cpp_sources="torch::Tensor spin(torch::Tensor q);",
    cuda_sources=cuda_source,
    functions=["spin"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return _ext.spin(q)
