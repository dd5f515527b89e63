"""Adaptive LayerNorm modulation of diffusion transformers (DiT, Flux, SD3), bf16."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "adaln_modulate"
DESCRIPTION = (
    "The adaLN-Zero modulation at the start of every block of a diffusion transformer, at "
    "Flux.1's size (hidden 3072, 4096 image + 512 text tokens, batch 2) in bfloat16: "
    "y = LayerNorm(x) * (1 + scale[b]) + shift[b], LayerNorm without affine parameters "
    "(eps 1e-6) in float32, shift and scale per sample from the timestep embedding. "
    "Memory-bound: one read of x, one write of y."
)
TAGS = ["normalization", "layernorm", "diffusion", "dit", "memory-bound", "fusion"]
DTYPE = "bfloat16"

batch_size = 2
seq_len = 4608
hidden_size = 3072
eps = 1e-6

SHAPE_SETS = {
    "public": {"batch_size": 2, "seq_len": 4608, "hidden_size": 3072},
    "heldout_sd3": {"batch_size": 4, "seq_len": 4429, "hidden_size": 1536},  # SD3 medium
    "heldout_dit": {"batch_size": 256, "seq_len": 256, "hidden_size": 1152},  # DiT-XL/2
    "tiny": {"batch_size": 2, "seq_len": 8, "hidden_size": 64},
}


class Model(nn.Module):
    """x (B, S, H), shift (B, H), scale (B, H) bf16 -> (B, S, H) bf16."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        h = F.layer_norm(x.to(acc), (x.shape[-1],), eps=self.eps)
        y = h * (1 + scale.to(acc)[:, None, :]) + shift.to(acc)[:, None, :]
        return y.to(x.dtype)


def get_inputs():
    x = torch.randn(batch_size, seq_len, hidden_size) + torch.randn(batch_size, seq_len, 1)
    shift = 0.5 * torch.randn(batch_size, hidden_size)
    scale = 0.5 * torch.randn(batch_size, hidden_size)
    return [x.to(torch.bfloat16), shift.to(torch.bfloat16), scale.to(torch.bfloat16)]


def get_init_inputs():
    return [eps]


def flop_count() -> float:
    # LayerNorm ~5 per element (mean, subtract, square-sum, scale), modulation 3: 8 * B*S*H.
    return float(8 * batch_size * seq_len * hidden_size)


def byte_count() -> float:
    # bf16: read x and write y (2 * 2*B*S*H), read shift and scale (2 * 2*B*H).
    return float(4 * batch_size * seq_len * hidden_size + 4 * batch_size * hidden_size)
