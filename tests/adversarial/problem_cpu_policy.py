"""Adversarial-suite CPU problem, custom kernel required: Linear then exact GELU, fp32.

y = gelu(x @ W^T + b) with x (batch, in_features), W (out_features, in_features).
in_features != out_features on purpose, so that the output buffer size differs from the input's
(a stale-memory candidate then finds its own previous output, not an input clone, in the
allocator's free lists).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "adv_linear_gelu_policy"
DESCRIPTION = (
    "y = gelu(x @ W^T + b): a Linear(2048 -> 1024) layer then exact GELU, fp32, batch 128."
)
TAGS = ["matmul", "gelu", "adversarial-suite"]
POLICY = {"require_custom_kernel": True}
DTYPE = "float32"

batch_size = 128
in_features = 2048
out_features = 1024


class Model(nn.Module):
    """Linear + GELU: x (B, K) -> (B, N)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


def flop_count() -> float:
    # GEMM 2*B*K*N, bias add B*N, GELU about 8 flops an element.
    return float(2 * batch_size * in_features * out_features + 9 * batch_size * out_features)


def byte_count() -> float:
    # fp32: read x, W and b once, write y once.
    return float(
        4
        * (
            batch_size * in_features
            + out_features * in_features
            + out_features
            + batch_size * out_features
        )
    )
