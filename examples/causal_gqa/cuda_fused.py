# expected: correct
# backend: cuda
"""Causal GQA in one fused CUDA kernel (flash-attention style, fp32 throughout).

One block of 4 warps per (batch, query head, tile of 16 query positions); each warp owns 4 query
rows. K/V tiles of 32 positions of the shared KV head are staged in shared memory; one lane scores
one key, an online softmax keeps a running max and sum per row, and P @ V is accumulated in
registers (lanes split the head dimension). Only key tiles at or before the query tile are read.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cmath>

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockQ = kWarps * kRowsPerWarp;  // query positions per block
constexpr int kBlockK = 32;                      // key positions per tile: one per lane
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// HD: head_dim rounded up to a supported size; D (runtime) <= HD is the real head_dim and the
// padding columns are zero in shared memory.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
causal_gqa_kernel(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ out,
                  int S, int Hq, int Hkv, int D, float scale) {
  constexpr int kSplit = HD < 32 ? 32 / HD : 1;   // lanes sharing one output column
  constexpr int kPerLane = HD < 32 ? 1 : HD / 32;  // output columns per lane
  constexpr int kStrideK = HD + 1;                 // odd stride: conflict-free K reads

  __shared__ float q_s[kBlockQ * HD];
  __shared__ float k_s[kBlockK * kStrideK];
  __shared__ float v_s[kBlockK * HD];

  const int q0 = blockIdx.x * kBlockQ;
  const int hq = blockIdx.y;
  const int b = blockIdx.z;
  const int hkv = hq / (Hq / Hkv);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // Stage this block's query rows (zero beyond S and beyond D).
  for (int idx = tid; idx < kBlockQ * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int t = q0 + r;
    float val = 0.f;
    if (t < S && d < D) val = q[(((int64_t)b * S + t) * Hq + hq) * D + d];
    q_s[idx] = val;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    #pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[r][i] = 0.f;
  }

  const int part = HD < 32 ? lane / HD : 0;  // which keys of a pair this lane sums (HD < 32)
  const int dcol = HD < 32 ? lane % HD : lane;
  const int q_last = min(q0 + kBlockQ, S) - 1;

  for (int k0 = 0; k0 <= q_last; k0 += kBlockK) {
    __syncthreads();  // previous tile fully consumed (and q_s visible on the first pass)
    for (int idx = tid; idx < kBlockK * HD; idx += blockDim.x) {
      const int j = idx / HD, d = idx % HD;
      const int t = k0 + j;
      float kv = 0.f, vv = 0.f;
      if (t < S && d < D) {
        const int64_t off = (((int64_t)b * S + t) * Hkv + hkv) * D + d;
        kv = k[off];
        vv = v[off];
      }
      k_s[j * kStrideK + d] = kv;
      v_s[j * HD + d] = vv;
    }
    __syncthreads();

    #pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int t = q0 + row;
      if (t >= S || k0 > t) continue;  // warp-uniform

      const int key = k0 + lane;
      const bool valid = key <= t;
      float s = -INFINITY;
      if (valid) {
        const float* qr = q_s + row * HD;
        const float* kr = k_s + lane * kStrideK;
        float dot = 0.f;
        #pragma unroll
        for (int d = 0; d < HD; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot * scale;
      }
      const float m_new = fmaxf(m[r], warp_max(s));  // finite: key k0 <= t is valid
      const float alpha = expf(m[r] - m_new);         // 0 on the first tile (m = -inf)
      const float p = valid ? expf(s - m_new) : 0.f;
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
      #pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[r][i] *= alpha;

      const int jmax = min(kBlockK - 1, t - k0);  // last valid key of this tile
      for (int j = 0; j <= jmax; j += kSplit) {
        const int jj = j + part;
        const float pj = __shfl_sync(kFull, p, jj);  // jj <= 31; p = 0 past jmax
        #pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[r][i] = fmaf(pj, v_s[jj * HD + dcol + 32 * i],
                                                          acc[r][i]);
      }
    }
  }

  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int t = q0 + warp * kRowsPerWarp + r;
    if (t >= S) continue;  // warp-uniform
    #pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      float a = acc[r][i];
      if (kSplit == 2) a += __shfl_xor_sync(kFull, a, 16);
      const int d = dcol + 32 * i;
      if (part == 0 && d < D) out[(((int64_t)b * S + t) * Hq + hq) * D + d] = a / l[r];
    }
  }
}

template <int HD>
void launch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            torch::Tensor& out) {
  const int B = q.size(0), S = q.size(1), Hq = q.size(2), D = q.size(3);
  const int Hkv = k.size(2);
  const dim3 grid((S + kBlockQ - 1) / kBlockQ, Hq, B);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  causal_gqa_kernel<HD><<<grid, kWarps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
      S, Hq, Hkv, D, scale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "q, k, v must be CUDA tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
              v.scalar_type() == at::kFloat, "q, k, v must be float32");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, S, H, D)");
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "k/v batch, length and head_dim must match q");
  TORCH_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0,
              "query heads must be a multiple of KV heads");
  c10::cuda::CUDAGuard guard(q.device());
  q = q.contiguous();
  k = k.contiguous();
  v = v.contiguous();
  auto out = torch::empty_like(q);
  if (q.numel() == 0) return out;
  const int D = q.size(3);
  if (D <= 16) launch<16>(q, k, v, out);
  else if (D <= 32) launch<32>(q, k, v, out);
  else if (D <= 64) launch<64>(q, k, v, out);
  else if (D <= 128) launch<128>(q, k, v, out);
  else TORCH_CHECK(false, "head_dim ", D, " > 128 is not supported");
  return out;
}
"""

cpp_source = "torch::Tensor causal_gqa_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v);"

_ext = load_inline(
    name="kj_causal_gqa_fused",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["causal_gqa_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.causal_gqa_forward(q, k, v)
