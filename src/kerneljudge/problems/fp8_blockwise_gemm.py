"""FP8 GEMM with block-wise scales, as DeepSeek-V3 trains and serves its linear layers."""

import torch
import torch.nn as nn

NAME = "fp8_blockwise_gemm"
DESCRIPTION = (
    "DeepSeek-V3's FP8 GEMM (the DeepGEMM problem): a (4096, 2048) float8_e4m3fn activation "
    "with one float32 scale per token per 128 columns, times a (7168, 2048) float8_e4m3fn "
    "weight with one float32 scale per 128 x 128 block (the last block row may be partial); "
    "c = (a * a_scale) @ (b * b_scale)^T, "
    "exact products accumulated in float32 (Hopper's FP8 tensor cores need the partial sums "
    "promoted every 128 columns to get there), rounded to bf16. K is a multiple of 128."
)
TAGS = ["quantization", "fp8", "gemm", "deepseek"]
DTYPE = "bfloat16"
COMPUTE_DTYPE = "float8_e4m3fn"  # the roofline's peak rate: FP8 tensor cores
POLICY = {"require_custom_kernel": True}

m = 4096
n = 7168
k = 2048
BLOCK = 128

SHAPE_SETS = {
    "public": {"m": 4096, "n": 7168, "k": 2048},
    "heldout_wide": {"m": 4096, "n": 2112, "k": 7168},  # DeepSeek-V3 q_a/kv_a projection
    "heldout_decode": {"m": 128, "n": 24576, "k": 1536},  # a small batch against q_b
    "tiny": {"m": 8, "n": 200, "k": 256},  # a partial block row, as heldout_wide has
}


class Model(nn.Module):
    """a (M, K) fp8, a_scale (M, K/128) fp32, b (N, K) fp8, b_scale (ceil(N/128), K/128) fp32.

    Returns c (M, N) bf16.
    """

    def forward(
        self, a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor
    ) -> torch.Tensor:
        acc = torch.promote_types(a_scale.dtype, torch.float32)
        a_deq = a.to(acc) * a_scale.repeat_interleave(BLOCK, dim=1)
        b_blocks = b_scale.repeat_interleave(BLOCK, dim=0)[: b.shape[0]]  # drop the padding
        b_deq = b.to(acc) * b_blocks.repeat_interleave(BLOCK, dim=1)
        # bf16 out; a float64 evaluation (inputs upcast) keeps float64.
        out_dtype = acc if a.dtype == torch.float64 else torch.bfloat16
        return (a_deq @ b_deq.T).to(out_dtype)


def get_inputs():
    kb = k // BLOCK
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    b = torch.randn(n, k).to(torch.float8_e4m3fn)
    # Scales in [0.5, 1.5) / sqrt(K) on b keep the outputs O(1).
    a_scale = 0.5 + torch.rand(m, kb)
    b_scale = (0.5 + torch.rand(-(-n // BLOCK), kb)) / k**0.5
    return [a, a_scale, b, b_scale]


def get_init_inputs():
    return []


def flop_count() -> float:
    # 2*M*N*K for the GEMM; the per-block scaling adds about 2*M*N*K/128.
    return float(2 * m * n * k * (1 + 1 / BLOCK))


def byte_count() -> float:
    # fp8 operands (M*K + N*K), fp32 scales (4 * (M + ceil(N/128)) * K/128), bf16 output
    # (2*M*N).
    scales = 4 * (m + -(-n // BLOCK)) * (k // BLOCK)
    return float(m * k + n * k + scales + 2 * m * n)
