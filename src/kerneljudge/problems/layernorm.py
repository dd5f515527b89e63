"""LayerNorm with affine weight and bias over the hidden dimension (fp32)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "layernorm"
DESCRIPTION = (
    "LayerNorm of ViT-L/16 (hidden 1024, eps 1e-6, affine weight and bias) over a training "
    "batch of 64 images x 257 tokens in float32, as mixed-precision training keeps norms in "
    "fp32: y = (x - mean) / sqrt(var + eps) * weight + bias, biased variance."
)
TAGS = ["normalization", "layernorm", "memory-bound", "vit"]
DTYPE = "float32"

num_rows = 64 * 257
hidden_size = 1024
eps = 1e-6

SHAPE_SETS = {
    "public": {"num_rows": 64 * 257, "hidden_size": 1024},
    "heldout_wide": {"num_rows": 8192, "hidden_size": 4096},  # GPT-style 4096 hidden
    "heldout_odd": {"num_rows": 16 * 257, "hidden_size": 1280},  # ViT-H/14
    "tiny": {"num_rows": 16, "hidden_size": 96},
}


class Model(nn.Module):
    """x (R, H) fp32 -> (R, H) fp32; weight and bias (H,) fp32."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(hidden_size))
        self.bias = nn.Parameter(0.2 * torch.randn(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def get_inputs():
    # Per-row offsets, as in real activations, make the mean subtraction matter.
    x = torch.randn(num_rows, hidden_size) + 2.0 * torch.randn(num_rows, 1)
    return [x]


def get_init_inputs():
    return [hidden_size, eps]


def flop_count() -> float:
    # Per element: sum (mean), subtract, square and sum (variance), scale, weight, bias: 7 * R*H.
    return float(7 * num_rows * hidden_size)


def byte_count() -> float:
    # fp32: read x, write y (2 * R*H), read weight and bias (2 * H).
    return float(4 * (2 * num_rows * hidden_size + 2 * hidden_size))
