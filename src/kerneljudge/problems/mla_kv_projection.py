"""Multi-head latent attention (MLA) key/value projection through a low-rank latent.

Each token's hidden state is compressed to a small latent vector by ``w_down`` and expanded back
into the keys and values of the KV heads by ``w_up_k`` and ``w_up_v``. The weights are forward
inputs, not parameters, so ``Model()`` takes no constructor arguments.
"""

import torch
import torch.nn as nn

NAME = "mla_kv_projection"
DESCRIPTION = (
    "Low-rank key/value projection of multi-head latent attention: hidden states (B, S, M) are "
    "compressed to a rank-R latent with w_down (M, R), then expanded to keys and values with "
    "w_up_k and w_up_v (R, 4 * head_dim). The output stacks them as (B, S, 2, 4, head_dim); the "
    "head split is always 4 KV heads, since the forward inputs do not carry it."
)
TAGS = ["attention", "gemm", "low-rank", "fusion", "mla"]
DTYPE = "float32"
# The task asks for a custom kernel: a forward of PyTorch operators only is rejected.
POLICY = {"require_custom_kernel": True}

batch_size = 4
seq_len = 96
model_dim = 256
rank = 48
kv_heads = 4  # fixed in every shape set: a candidate cannot read it from the inputs
head_dim = 32

SHAPE_SETS = {
    "public": {
        "batch_size": 4,
        "seq_len": 96,
        "model_dim": 256,
        "rank": 48,
        "kv_heads": 4,
        "head_dim": 32,
    },
    "heldout_a": {
        "batch_size": 2,
        "seq_len": 257,
        "model_dim": 384,
        "rank": 64,
        "kv_heads": 4,
        "head_dim": 32,
    },
    "heldout_b": {
        "batch_size": 8,
        "seq_len": 50,
        "model_dim": 192,
        "rank": 40,
        "kv_heads": 4,
        "head_dim": 64,
    },
}


class Model(nn.Module):
    """latent = hidden @ w_down; k = latent @ w_up_k; v = latent @ w_up_v; stack (k, v)."""

    def __init__(self):
        super().__init__()

    def forward(
        self,
        hidden: torch.Tensor,
        w_down: torch.Tensor,
        w_up_k: torch.Tensor,
        w_up_v: torch.Tensor,
    ) -> torch.Tensor:
        """hidden (B, S, M), w_down (M, R), w_up_k and w_up_v (R, H*D) -> (B, S, 2, H, D)."""
        B, S, M = hidden.shape
        heads = kv_heads
        dim = w_up_k.shape[1] // heads
        latent = hidden.reshape(B * S, M) @ w_down  # (B*S, R)
        k = latent @ w_up_k  # (B*S, H*D)
        v = latent @ w_up_v
        k = k.view(B, S, heads, dim)
        v = v.view(B, S, heads, dim)
        return torch.stack((k, v), dim=2)


def get_inputs():
    out_dim = kv_heads * head_dim
    hidden = torch.randn(batch_size, seq_len, model_dim)
    # Scaled by 1/sqrt(fan_in) so the latent and the outputs stay O(1).
    w_down = torch.randn(model_dim, rank) / model_dim**0.5
    w_up_k = torch.randn(rank, out_dim) / rank**0.5
    w_up_v = torch.randn(rank, out_dim) / rank**0.5
    return [hidden, w_down, w_up_k, w_up_v]


def get_init_inputs():
    return []


def flop_count() -> float:
    # Two chained GEMMs per token, 2 FLOPs per multiply-add:
    #   tokens * 2 * (M * R + 2 * R * H*D), tokens = B * S
    tokens = batch_size * seq_len
    out_dim = kv_heads * head_dim
    return float(2 * tokens * (model_dim * rank + 2 * rank * out_dim))


def byte_count() -> float:
    # fp32: read hidden (B*S*M) and the three weights (M*R + 2*R*H*D), write the output
    # (B*S*2*H*D); the latent need never leave the chip.
    tokens = batch_size * seq_len
    out_dim = kv_heads * head_dim
    elements = tokens * model_dim + model_dim * rank + 2 * rank * out_dim + tokens * 2 * out_dim
    return float(4 * elements)
