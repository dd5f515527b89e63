"""Residual add fused with RMSNorm, as vLLM's fused_add_rms_norm runs it between layers (bf16)."""

import torch
import torch.nn as nn

NAME = "fused_add_rmsnorm"
DESCRIPTION = (
    "Residual add + RMSNorm of Llama 3 70B (hidden 8192, eps 1e-5) over 4096 tokens in "
    "bfloat16, the op vLLM fuses between attention and MLP: h = x + residual in float32, the "
    "new residual is h rounded to bf16, and y = weight * (h / sqrt(mean(h^2) + eps)) with the "
    "statistics taken on the float32 h. Returns (y, new_residual)."
)
TAGS = ["normalization", "rmsnorm", "fusion", "memory-bound", "llama"]
DTYPE = "bfloat16"

num_tokens = 4096
hidden_size = 8192
eps = 1e-5

SHAPE_SETS = {
    "public": {"num_tokens": 4096, "hidden_size": 8192},
    "heldout_8b": {"num_tokens": 16384, "hidden_size": 4096},  # Llama 3 8B
    "heldout_odd": {"num_tokens": 2999, "hidden_size": 5120},  # Qwen2.5 14B, ragged
    "tiny": {"num_tokens": 16, "hidden_size": 64},
}


class Model(nn.Module):
    """x, residual (T, H) bf16 -> (y (T, H) bf16, new_residual (T, H) bf16)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(hidden_size)).to(torch.bfloat16))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x.float() + residual.float()
        inv_rms = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        y = (h * inv_rms * self.weight.float()).to(x.dtype)
        return y, h.to(x.dtype)


def get_inputs():
    x = torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16)
    residual = (4.0 * torch.randn(num_tokens, hidden_size)).to(torch.bfloat16)
    return [x, residual]


def get_init_inputs():
    return [hidden_size, eps]


def flop_count() -> float:
    # Per element: add, square, sum, scale, weight multiply: 5 * T * H.
    return float(5 * num_tokens * hidden_size)


def byte_count() -> float:
    # bf16: read x and residual, write y and the new residual (4 * T*H), read weight (H).
    return float(2 * (4 * num_tokens * hidden_size + hidden_size))
