"""Causal grouped-query attention over a prefill, at Llama 3 8B's head layout (bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "causal_prefill_attention"
DESCRIPTION = (
    "Causal self-attention of a Llama 3 8B prefill in bfloat16: 32 query heads share 8 KV "
    "heads (query head h reads KV head h // 4), head_dim 128, 2 sequences of 4096 tokens, "
    "layout (batch, heads, seq, head_dim), scale 1/sqrt(head_dim). Position i attends to "
    "positions 0..i. The FlashAttention problem: never materialise the (seq, seq) scores."
)
TAGS = ["attention", "causal", "gqa", "softmax", "prefill", "llama"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_size = 2
seq_len = 4096
num_q_heads = 32
num_kv_heads = 8
head_dim = 128

SHAPE_SETS = {
    "public": {"batch_size": 2, "seq_len": 4096, "num_q_heads": 32, "num_kv_heads": 8},
    "heldout_long": {"batch_size": 1, "seq_len": 8192, "num_q_heads": 32, "num_kv_heads": 8},
    # Llama 3 70B heads (64 query, 8 KV), ragged sequence length.
    "heldout_70b": {"batch_size": 2, "seq_len": 3001, "num_q_heads": 64, "num_kv_heads": 8},
    "tiny": {"batch_size": 1, "seq_len": 32, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16},
}


class Model(nn.Module):
    """q (B, Hq, S, D), k and v (B, Hkv, S, D), bf16 -> (B, Hq, S, D) bf16."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def get_inputs():
    # Queries and keys of std 1.6 give scores of std ~2.5, so attention is peaked as in trained
    # models instead of averaging v over thousands of keys to ~0.
    q = (1.6 * torch.randn(batch_size, num_q_heads, seq_len, head_dim)).to(torch.bfloat16)
    k = (1.6 * torch.randn(batch_size, num_kv_heads, seq_len, head_dim)).to(torch.bfloat16)
    v = torch.randn(batch_size, num_kv_heads, seq_len, head_dim, dtype=torch.bfloat16)
    return [q, k, v]


def get_init_inputs():
    return []


def flop_count() -> float:
    # S*(S+1)/2 (query, key) pairs per head: 2*D for q.k and 2*D for p*v each, plus softmax
    # (~5 per pair): B * Hq * S(S+1)/2 * (4*D + 5).
    pairs = batch_size * num_q_heads * seq_len * (seq_len + 1) / 2
    return float(pairs * (4 * head_dim + 5))


def byte_count() -> float:
    # bf16: read q and write the output (B*Hq*S*D each), read k and v (B*Hkv*S*D each).
    return float(2 * batch_size * seq_len * head_dim * (2 * num_q_heads + 2 * num_kv_heads))
