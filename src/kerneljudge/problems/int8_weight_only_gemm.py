"""Int8 weight-only quantised linear layer at decode batch sizes (bf16 activations)."""

import torch
import torch.nn as nn

NAME = "int8_weight_only_gemm"
DESCRIPTION = (
    "An int8 weight-only quantised linear layer as torchao and TensorRT-LLM run it for "
    "decode: bf16 activations x (16 tokens, 4096) times the fused gate/up projection of "
    "Llama 3 8B stored as int8 weights (28672, 4096) with one bf16 scale per output channel: "
    "y = (x @ w_int8^T) * scales, the int8 values converted to bf16 exactly and accumulated "
    "in float32, the product rounded to bf16 before the scale. Memory-bound on the weight "
    "read: dequantise in registers, never in memory."
)
TAGS = ["quantization", "int8", "gemm", "gemv", "decode", "memory-bound", "llama"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_tokens = 16
in_features = 4096
out_features = 28672

SHAPE_SETS = {
    "public": {"batch_tokens": 16, "in_features": 4096, "out_features": 28672},
    "heldout_gemv": {"batch_tokens": 1, "in_features": 14336, "out_features": 4096},
    "heldout_70b": {"batch_tokens": 64, "in_features": 8192, "out_features": 10240},
    "tiny": {"batch_tokens": 4, "in_features": 64, "out_features": 96},
}


class Model(nn.Module):
    """x (M, K) bf16, w_int8 (N, K) int8, scales (N,) bf16 -> (M, N) bf16."""

    def forward(self, x: torch.Tensor, w_int8: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return (x @ w_int8.to(x.dtype).T) * scales


def get_inputs():
    x = torch.randn(batch_tokens, in_features, dtype=torch.bfloat16)
    w_int8 = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8)
    # Symmetric per-channel scales: a row of 127-level integers times its scale has entries of
    # std ~ 1/sqrt(K), so outputs are O(1).
    scales = (0.5 + torch.rand(out_features)) / (73.0 * in_features**0.5)
    return [x, w_int8, scales.to(torch.bfloat16)]


def get_init_inputs():
    return []


def flop_count() -> float:
    # GEMM 2*M*N*K, plus the per-element scale M*N (the int8 -> bf16 conversions are not FLOPs).
    return float(2 * batch_tokens * out_features * in_features + batch_tokens * out_features)


def byte_count() -> float:
    # int8 weight (N*K), bf16 x (2*M*K), bf16 scales (2*N), bf16 output (2*M*N).
    M, K, N = batch_tokens, in_features, out_features
    return float(N * K + 2 * M * K + 2 * N + 2 * M * N)
