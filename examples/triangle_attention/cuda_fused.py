# expected: correct
# backend: cuda
"""Triangle attention with the attention core fused into one CUDA kernel (fp32 throughout).

The q, k, v, gate and pair-bias projections run as a single GEMM over the concatenated weights.
One kernel then does, per (row, head, tile of 16 queries): q.k scaling, pair bias, key mask, an
online softmax over tiles of 32 keys staged in shared memory, P @ V, and the sigmoid gate, so the
(B, N, heads, N, N) attention tensor is never written to memory. The output projection is a
second GEMM.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
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
constexpr int kBlockQ = kWarps * kRowsPerWarp;  // query entries per block
constexpr int kBlockK = 32;                      // key entries per tile: one per lane
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

// proj (B, N, N, ld): columns [q | k | v | gate | ...], each D = heads * dh wide, gate without
// its bias. bias (B, heads, N, N), mask (B, N, N), out (B, N, N, D) = sigmoid(gate) * attention.
// HD: dh rounded up to a supported size; padding columns are zero in shared memory.
template <int HD>
__global__ void __launch_bounds__(kWarps * 32)
triangle_attention_kernel(const float* __restrict__ proj, const float* __restrict__ bias,
                          const float* __restrict__ mask, const float* __restrict__ gate_bias,
                          float* __restrict__ out, int N, int heads, int dh, int ld,
                          float scale) {
  constexpr int kSplit = HD < 32 ? 32 / HD : 1;   // lanes sharing one output column
  constexpr int kPerLane = HD < 32 ? 1 : HD / 32;  // output columns per lane
  constexpr int kStrideK = HD + 1;                 // odd stride: conflict-free K reads

  __shared__ float q_s[kBlockQ * HD];
  __shared__ float k_s[kBlockK * kStrideK];
  __shared__ float v_s[kBlockK * HD];

  const int q0 = blockIdx.x * kBlockQ;
  const int head = blockIdx.y;
  const int64_t row = blockIdx.z;  // b * N + i: one row of the pair representation
  const int64_t b = row / N;
  const int D = heads * dh;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const float* row_proj = proj + row * N * ld;
  const float* mask_b = mask + b * N * N;
  const float* bias_bh = bias + (b * heads + head) * N * N;

  for (int idx = tid; idx < kBlockQ * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int j = q0 + r;
    q_s[idx] = (j < N && d < dh) ? row_proj[(int64_t)j * ld + head * dh + d] : 0.f;
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

  for (int k0 = 0; k0 < N; k0 += kBlockK) {
    __syncthreads();  // previous tile fully consumed (and q_s visible on the first pass)
    for (int idx = tid; idx < kBlockK * HD; idx += blockDim.x) {
      const int jj = idx / HD, d = idx % HD;
      const int key = k0 + jj;
      float kv = 0.f, vv = 0.f;
      if (key < N && d < dh) {
        const float* src = row_proj + (int64_t)key * ld + head * dh + d;
        kv = src[D];
        vv = src[2 * D];
      }
      k_s[jj * kStrideK + d] = kv;
      v_s[jj * HD + d] = vv;
    }
    __syncthreads();

    const int jmax = min(kBlockK - 1, N - 1 - k0);  // last key of this tile
    #pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qi = q0 + warp * kRowsPerWarp + r;
      if (qi >= N) continue;  // warp-uniform

      const int key = k0 + lane;
      bool valid = key < N && mask_b[(int64_t)qi * N + key] != 0.f;
      float s = -INFINITY;
      if (valid) {
        const float* qr = q_s + (qi - q0) * HD;
        const float* kr = k_s + lane * kStrideK;
        float dot = 0.f;
        #pragma unroll
        for (int d = 0; d < HD; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = fmaf(dot, scale, bias_bh[(int64_t)qi * N + key]);
      }
      const float m_new = fmaxf(m[r], warp_max(s));
      if (m_new == -INFINITY) continue;  // no unmasked key yet (warp-uniform)
      const float alpha = expf(m[r] - m_new);  // 0 while m = -inf
      const float p = valid ? expf(s - m_new) : 0.f;
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
      #pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[r][i] *= alpha;
      for (int j = 0; j <= jmax; j += kSplit) {
        const int jj = j + part;  // <= 31; p = 0 for keys past jmax
        const float pj = __shfl_sync(kFull, p, jj);
        #pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[r][i] = fmaf(pj, v_s[jj * HD + dcol + 32 * i],
                                                          acc[r][i]);
      }
    }
  }

  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int qi = q0 + warp * kRowsPerWarp + r;
    if (qi >= N) continue;  // warp-uniform
    #pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      float a = acc[r][i];
      if (kSplit == 2) a += __shfl_xor_sync(kFull, a, 16);
      const int d = dcol + 32 * i;
      if (part == 0 && d < dh) {
        const int c = head * dh + d;
        const float g = row_proj[(int64_t)qi * ld + 3 * D + c] + gate_bias[c];
        out[(row * N + qi) * D + c] = (a / l[r]) / (1.f + expf(-g));
      }
    }
  }
}

template <int HD>
void launch(const torch::Tensor& proj, const torch::Tensor& bias, const torch::Tensor& mask,
            const torch::Tensor& gate_bias, torch::Tensor& out, int heads) {
  const int B = proj.size(0), N = proj.size(1), ld = proj.size(3);
  const int D = out.size(3), dh = D / heads;
  const dim3 grid((N + kBlockQ - 1) / kBlockQ, heads, B * N);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  triangle_attention_kernel<HD><<<grid, kWarps * 32, 0, stream>>>(
      proj.data_ptr<float>(), bias.data_ptr<float>(), mask.data_ptr<float>(),
      gate_bias.data_ptr<float>(), out.data_ptr<float>(), N, heads, dh, ld, scale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

torch::Tensor triangle_attention_core(torch::Tensor proj, torch::Tensor bias, torch::Tensor mask,
                                      torch::Tensor gate_bias, int64_t heads) {
  TORCH_CHECK(proj.is_cuda() && bias.is_cuda() && mask.is_cuda() && gate_bias.is_cuda(),
              "all inputs must be CUDA tensors");
  TORCH_CHECK(proj.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat &&
              mask.scalar_type() == at::kFloat && gate_bias.scalar_type() == at::kFloat,
              "all inputs must be float32");
  TORCH_CHECK(proj.dim() == 4 && proj.size(1) == proj.size(2), "proj must be (B, N, N, C)");
  const int64_t B = proj.size(0), N = proj.size(1);
  const int64_t D = gate_bias.numel();
  TORCH_CHECK(heads > 0 && D % heads == 0, "pair_dim must be a multiple of heads");
  TORCH_CHECK(proj.size(3) >= 4 * D, "proj must hold q, k, v and gate columns");
  TORCH_CHECK(bias.dim() == 4 && bias.size(0) == B && bias.size(1) == heads &&
              bias.size(2) == N && bias.size(3) == N, "bias must be (B, heads, N, N)");
  TORCH_CHECK(mask.dim() == 3 && mask.size(0) == B && mask.size(1) == N && mask.size(2) == N,
              "mask must be (B, N, N)");
  TORCH_CHECK(B * N <= 65535, "B * N must be at most 65535");
  c10::cuda::CUDAGuard guard(proj.device());
  proj = proj.contiguous();
  bias = bias.contiguous();
  mask = mask.contiguous();
  gate_bias = gate_bias.contiguous();
  auto out = torch::empty({B, N, N, D}, proj.options());
  if (out.numel() == 0) return out;
  const int64_t dh = D / heads;
  if (dh <= 16) launch<16>(proj, bias, mask, gate_bias, out, heads);
  else if (dh <= 32) launch<32>(proj, bias, mask, gate_bias, out, heads);
  else if (dh <= 64) launch<64>(proj, bias, mask, gate_bias, out, heads);
  else if (dh <= 128) launch<128>(proj, bias, mask, gate_bias, out, heads);
  else TORCH_CHECK(false, "head_dim ", dh, " > 128 is not supported");
  return out;
}
"""

cpp_source = (
    "torch::Tensor triangle_attention_core(torch::Tensor proj, torch::Tensor bias, "
    "torch::Tensor mask, torch::Tensor gate_bias, int64_t heads);"
)

_ext = load_inline(
    name="kj_triangle_attention_fused",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["triangle_attention_core"],
    extra_cuda_cflags=["-O3"],
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
        D = pair_repr.shape[-1]
        x = self.layer_norm(pair_repr)  # (B, N, N, D)
        weight = torch.cat(
            [self.query.weight, self.key.weight, self.value.weight, self.gate.weight,
             self.bias_proj.weight]
        )  # (4D + heads, D)
        proj = F.linear(x, weight)  # (B, N, N, 4D + heads): q | k | v | gate | bias
        bias = proj[..., 4 * D:].permute(0, 3, 1, 2).contiguous()  # (B, heads, N, N)
        mask = pair_mask.to(torch.float32)
        gated = _ext.triangle_attention_core(proj, bias, mask, self.gate.bias, self.num_heads)
        return self.out_proj(gated)
