# expected: compile_error
# backend: cuda
# compile-error-line: 29
"""Known-broken CUDA candidate: the softmax reduction calls `__shfl_xor_synk`, a misspelling of
`__shfl_xor_sync` that no header declares, so nvcc rejects it. The declared line is the one nvcc
points at."""

import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// One warp per row of scores (rows, N): in-place softmax over keys where mask != 0.
__global__ void masked_softmax_kernel(float* __restrict__ scores, const float* __restrict__ mask,
                                      int64_t rows, int N) {
  const int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float* s = scores + r * N;
  const float* m = mask + r * N;
  float mx = -INFINITY;
  for (int k = lane; k < N; k += 32) mx = fmaxf(mx, m[k] != 0.f ? s[k] : -INFINITY);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_synk(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int k = lane; k < N; k += 32) {
    const float e = m[k] != 0.f ? expf(s[k] - mx) : 0.f;
    s[k] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  for (int k = lane; k < N; k += 32) s[k] /= sum;
}

// scores (B, N, h, N, N) in place; mask (B, N, N) broadcast over rows and heads.
torch::Tensor masked_softmax(torch::Tensor scores, torch::Tensor mask) {
  scores = scores.contiguous();
  mask = mask.contiguous().to(torch::kFloat);
  const int64_t B = scores.size(0), N = scores.size(1), H = scores.size(2);
  // Row (b, i, head, j) uses mask row (b, j): expand the mask so rows line up one to one.
  auto m = mask.view({B, 1, 1, N, N}).expand({B, N, H, N, N}).contiguous();
  const int64_t rows = scores.numel() / N;
  const int warps = 8;
  const int blocks = static_cast<int>((rows + warps - 1) / warps);
  masked_softmax_kernel<<<blocks, warps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      scores.data_ptr<float>(), m.data_ptr<float>(), rows, static_cast<int>(N));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return scores;
}
"""

cpp_source = "torch::Tensor masked_softmax(torch::Tensor scores, torch::Tensor mask);"

_ext = load_inline(
    name="kj_triangle_attention_compile_error",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["masked_softmax"],
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
        bias = self.bias_proj(x).permute(0, 3, 1, 2)
        x_flat = x.reshape(B * N, N, D)
        q = self.query(x_flat).view(B * N, N, h, d).transpose(1, 2)
        k = self.key(x_flat).view(B * N, N, h, d).transpose(1, 2)
        v = self.value(x_flat).view(B * N, N, h, d).transpose(1, 2)
        attn = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        attn = attn.view(B, N, h, N, N) + bias.unsqueeze(1)
        attn = _ext.masked_softmax(attn, pair_mask).view(B * N, h, N, N)
        out = (attn @ v).transpose(1, 2).reshape(B, N, N, D)
        return self.out_proj(g * out)
