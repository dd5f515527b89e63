"""Causal sliding-window grouped-query attention, as in Mistral and Gemma's local layers (bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "sliding_window_attention"
DESCRIPTION = (
    "Causal sliding-window attention in bfloat16 with Mistral 7B's head layout (32 query heads "
    "share 8 KV heads, head_dim 128) and a 1024-token window as in Gemma 3's local layers: "
    "position i attends to positions max(0, i - window + 1)..i. 2 sequences of 8192 tokens, "
    "layout (batch, heads, seq, head_dim), scale 1/sqrt(head_dim). A good kernel skips the "
    "tiles outside the band, so its work grows with seq * window, not seq^2."
)
TAGS = ["attention", "causal", "sliding-window", "gqa", "softmax", "prefill", "mistral"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_size = 2
seq_len = 8192
window = 1024
num_q_heads = 32
num_kv_heads = 8
head_dim = 128

SHAPE_SETS = {
    "public": {"batch_size": 2, "seq_len": 8192, "window": 1024},
    "heldout_mistral": {"batch_size": 1, "seq_len": 16384, "window": 4096},  # Mistral 7B v0.1
    "heldout_odd": {"batch_size": 3, "seq_len": 5000, "window": 2048},
    "tiny": {
        "batch_size": 1,
        "seq_len": 32,
        "window": 8,
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
    },
}


class Model(nn.Module):
    """q (B, Hq, S, D), k and v (B, Hkv, S, D), bf16 -> (B, Hq, S, D) bf16."""

    def __init__(self, window: int):
        super().__init__()
        self.window = window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        S = q.shape[2]
        i = torch.arange(S, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        allowed = (j <= i) & (j > i - self.window)  # (S, S); the diagonal is always allowed
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)


def get_inputs():
    # Scores of std ~2.5 keep attention peaked, as in trained models (see causal_prefill).
    q = (1.6 * torch.randn(batch_size, num_q_heads, seq_len, head_dim)).to(torch.bfloat16)
    k = (1.6 * torch.randn(batch_size, num_kv_heads, seq_len, head_dim)).to(torch.bfloat16)
    v = torch.randn(batch_size, num_kv_heads, seq_len, head_dim, dtype=torch.bfloat16)
    return [q, k, v]


def get_init_inputs():
    return [window]


def flop_count() -> float:
    # Query i sees min(i + 1, W) keys: sum = S*W - W*(W-1)/2 for S >= W (else S(S+1)/2).
    # Each (query, key) pair: 4*D FLOPs (q.k and p*v) + ~5 softmax.
    S, W = seq_len, min(window, seq_len)
    pairs = S * W - W * (W - 1) / 2
    return float(batch_size * num_q_heads * pairs * (4 * head_dim + 5))


def byte_count() -> float:
    # bf16: read q and write the output (B*Hq*S*D each), read k and v (B*Hkv*S*D each).
    return float(2 * batch_size * seq_len * head_dim * (2 * num_q_heads + 2 * num_kv_heads))
