"""Causal depthwise 1-D convolution with SiLU, the short convolution of Mamba blocks (bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "causal_depthwise_conv1d"
DESCRIPTION = (
    "The causal depthwise convolution of a Mamba-2.8b block (5120 channels, kernel width 4, "
    "with bias) followed by SiLU, over 4 sequences of 4096 tokens in bfloat16, as the "
    "causal_conv1d package computes it: out[b, c, t] = silu(bias[c] + sum_{k<4} w[c, k] * "
    "x[b, c, t - 3 + k]), x taken as 0 before t = 0, accumulated in float32. Memory-bound."
)
TAGS = ["convolution", "depthwise", "causal", "mamba", "memory-bound"]
DTYPE = "bfloat16"

batch_size = 4
channels = 5120
seq_len = 4096
kernel_width = 4

SHAPE_SETS = {
    "public": {"batch_size": 4, "channels": 5120, "seq_len": 4096},
    "heldout_mamba2": {"batch_size": 8, "channels": 8448, "seq_len": 2048},  # x, B, C of Mamba-2
    "heldout_odd": {"batch_size": 3, "channels": 3072, "seq_len": 3001},
    "tiny": {"batch_size": 2, "channels": 8, "seq_len": 16},
}


class Model(nn.Module):
    """x (B, C, L) bf16 -> (B, C, L) bf16; weight (C, 1, W) and bias (C,) bf16."""

    def __init__(self, channels: int, kernel_width: int):
        super().__init__()
        self.conv = nn.Conv1d(
            channels,
            channels,
            kernel_width,
            groups=channels,
            padding=kernel_width - 1,
            dtype=torch.bfloat16,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(x.dtype, torch.float32)
        w = self.conv.weight.to(acc)
        b = None if self.conv.bias is None else self.conv.bias.to(acc)
        y = F.conv1d(x.to(acc), w, b, padding=w.shape[-1] - 1, groups=x.shape[1])
        return F.silu(y[..., : x.shape[-1]]).to(x.dtype)  # keep the causal part


def get_inputs():
    return [torch.randn(batch_size, channels, seq_len, dtype=torch.bfloat16)]


def get_init_inputs():
    return [channels, kernel_width]


def flop_count() -> float:
    # Per output: W multiply-adds (2*W), bias, SiLU (~4): (2*W + 5) * B*C*L.
    return float((2 * kernel_width + 5) * batch_size * channels * seq_len)


def byte_count() -> float:
    # bf16: read x, write the output (2 * 2*B*C*L), weights and bias (2*C*(W+1)).
    return float(2 * 2 * batch_size * channels * seq_len + 2 * channels * (kernel_width + 1))
