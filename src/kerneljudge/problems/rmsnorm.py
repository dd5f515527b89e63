"""RMSNorm over the hidden dimension, as in every Llama-family decoder layer (bf16)."""

import torch
import torch.nn as nn

NAME = "rmsnorm"
DESCRIPTION = (
    "RMSNorm of Llama 3 8B (hidden 4096, eps 1e-5) over a prefill batch of 8192 tokens in "
    "bfloat16: y = weight * (x / sqrt(mean(x^2) + eps)), the statistics in float32 and the "
    "normalised row rounded to bf16 before the weight multiply, as in Hugging Face's "
    "LlamaRMSNorm. Memory-bound: one read of x, one write of y."
)
TAGS = ["normalization", "rmsnorm", "memory-bound", "llama"]
DTYPE = "bfloat16"

num_tokens = 8192
hidden_size = 4096
eps = 1e-5

SHAPE_SETS = {
    "public": {"num_tokens": 8192, "hidden_size": 4096},
    "heldout_70b": {"num_tokens": 4096, "hidden_size": 8192},  # Llama 3 70B
    "heldout_odd": {"num_tokens": 3001, "hidden_size": 3584},  # Qwen2 7B, ragged token count
    "tiny": {"num_tokens": 16, "hidden_size": 64},
}


class Model(nn.Module):
    """y = weight * rmsnorm(x): x (T, H) bf16, weight (H,) bf16 -> y (T, H) bf16."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        # Trained norm weights are far from 1; random ones make ignoring the weight visible.
        self.weight = nn.Parameter((1.0 + 0.2 * torch.randn(hidden_size)).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * (x32 * inv_rms).to(x.dtype)


def get_inputs():
    return [torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16)]


def get_init_inputs():
    return [hidden_size, eps]


def flop_count() -> float:
    # Per element: square, add (sum), scale by 1/rms, multiply by weight: 4 * T * H.
    return float(4 * num_tokens * hidden_size)


def byte_count() -> float:
    # bf16: read x (T*H), write y (T*H), read weight (H).
    return float(2 * (2 * num_tokens * hidden_size + hidden_size))
