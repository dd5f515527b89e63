"""Causal grouped-query attention, written as a naive loop over query positions.

Several query heads share one key/value head: each KV head serves a contiguous group of
``num_q_heads // num_kv_heads`` query heads. Tensors use the (batch, time, head, dim) layout.
"""

import math

import torch
import torch.nn as nn

NAME = "causal_gqa"
DESCRIPTION = (
    "Causal grouped-query attention: 8 query heads share 2 key/value heads (each KV head serves "
    "4 consecutive query heads), head_dim 32, inputs in (batch, time, head, dim) layout. The "
    "reference expands K and V with repeat_interleave and loops over query positions, each one "
    "attending to itself and every earlier position with softmax(q.k / sqrt(head_dim))."
)
TAGS = ["attention", "causal", "gqa", "softmax"]
DTYPE = "float32"
# The task asks for a custom kernel: a forward of PyTorch operators only is rejected.
POLICY = {"require_custom_kernel": True}

batch_size = 2
seq_len = 80
num_q_heads = 8
num_kv_heads = 2
head_dim = 32

SHAPE_SETS = {
    "public": {
        "batch_size": 2,
        "seq_len": 80,
        "num_q_heads": 8,
        "num_kv_heads": 2,
        "head_dim": 32,
    },
    "heldout_a": {
        "batch_size": 1,
        "seq_len": 203,
        "num_q_heads": 12,
        "num_kv_heads": 3,
        "head_dim": 32,
    },
    "heldout_b": {
        "batch_size": 3,
        "seq_len": 64,
        "num_q_heads": 4,
        "num_kv_heads": 1,
        "head_dim": 16,
    },
}


class Model(nn.Module):
    """Causal GQA: out[b, t, h] = softmax(q[b, t, h] . k[b, :t+1, h // group]) @ v[...]."""

    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (B, S, Hq, D), k and v (B, S, Hkv, D) -> (B, S, Hq, D)."""
        B, S, Hq, D = q.shape
        group = Hq // k.shape[2]
        # Each KV head serves `group` consecutive query heads.
        k = k.repeat_interleave(group, dim=2)  # (B, S, Hq, D)
        v = v.repeat_interleave(group, dim=2)
        scale = 1.0 / math.sqrt(D)
        outs = []
        for t in range(S):
            scores = torch.einsum("bhd,bshd->bhs", q[:, t], k[:, : t + 1]) * scale
            weights = torch.softmax(scores, dim=-1)  # (B, Hq, t+1)
            outs.append(torch.einsum("bhs,bshd->bhd", weights, v[:, : t + 1]))
        return torch.stack(outs, dim=1)


def get_inputs():
    q = torch.randn(batch_size, seq_len, num_q_heads, head_dim)
    k = torch.randn(batch_size, seq_len, num_kv_heads, head_dim)
    v = torch.randn(batch_size, seq_len, num_kv_heads, head_dim)
    return [q, k, v]


def get_init_inputs():
    return []


def flop_count() -> float:
    # Query t attends to t+1 keys: 2*D FLOPs for q.k and 2*D for p*v per key, summed over t:
    #   B * Hq * 4*D * S*(S+1)/2, plus softmax (max, sub, exp, sum, div) 5 * B*Hq*S*(S+1)/2
    pairs = batch_size * num_q_heads * seq_len * (seq_len + 1) / 2
    return float(pairs * (4 * head_dim + 5))


def byte_count() -> float:
    # fp32: read q (B*S*Hq*D), k and v (B*S*Hkv*D each), write the output (B*S*Hq*D).
    tokens = batch_size * seq_len
    return float(4 * tokens * head_dim * (2 * num_q_heads + 2 * num_kv_heads))
