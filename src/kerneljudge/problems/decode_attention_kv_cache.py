"""One decode step of grouped-query attention against a KV cache (bf16)."""

import torch
import torch.nn as nn

NAME = "decode_attention_kv_cache"
DESCRIPTION = (
    "A decode step of Llama 3 8B attention in bfloat16: a batch of 32 sequences, each with one "
    "new query token (32 query heads, head_dim 128) attending to its KV cache (8 KV heads, "
    "capacity 4096 positions) up to its own length cache_seqlens[b] (2049..4096); query head h "
    "reads KV head h // 4, scale 1/sqrt(head_dim), scores and softmax in float32. Memory-bound "
    "on reading the cache; the FlashDecoding problem (split the keys across blocks)."
)
TAGS = ["attention", "decode", "kv-cache", "gqa", "memory-bound", "llama"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_size = 32
max_seq_len = 4096
num_q_heads = 32
num_kv_heads = 8
head_dim = 128

SHAPE_SETS = {
    "public": {"batch_size": 32, "max_seq_len": 4096},
    "heldout_long": {"batch_size": 4, "max_seq_len": 32768},
    # Llama 3 70B sharded 8 ways: 8 query heads and 1 KV head per GPU.
    "heldout_70b_tp8": {
        "batch_size": 64,
        "max_seq_len": 4096,
        "num_q_heads": 8,
        "num_kv_heads": 1,
    },
    "tiny": {
        "batch_size": 3,
        "max_seq_len": 32,
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
    },
}


class Model(nn.Module):
    """q (B, Hq, D), caches (B, Hkv, Smax, D) bf16, cache_seqlens (B,) int32 -> (B, Hq, D)."""

    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cache_seqlens: torch.Tensor,
    ) -> torch.Tensor:
        B, Hq, D = q.shape
        Hkv, S = k_cache.shape[1], k_cache.shape[2]
        qg = q.float().view(B, Hkv, Hq // Hkv, D)  # query heads grouped by their KV head
        scores = torch.einsum("bhgd,bhsd->bhgs", qg, k_cache.float()) * D**-0.5
        beyond = torch.arange(S, device=q.device)[None, :] >= cache_seqlens[:, None].long()
        scores = scores.masked_fill(beyond[:, None, None, :], float("-inf"))
        out = torch.einsum("bhgs,bhsd->bhgd", scores.softmax(dim=-1), v_cache.float())
        return out.reshape(B, Hq, D).to(q.dtype)


def get_inputs():
    # Scores of std ~2.5 keep attention peaked, as in trained models.
    q = (1.6 * torch.randn(batch_size, num_q_heads, head_dim)).to(torch.bfloat16)
    shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
    k_cache = (1.6 * torch.randn(shape)).to(torch.bfloat16)
    v_cache = torch.randn(shape, dtype=torch.bfloat16)
    # Lengths between half and all of the capacity: no row is ever fully masked.
    low = max_seq_len // 2 + 1
    cache_seqlens = torch.randint(low, max_seq_len + 1, (batch_size,), dtype=torch.int32)
    return [q, k_cache, v_cache, cache_seqlens]


def get_init_inputs():
    return []


def _min_len() -> int:
    # Lengths are drawn from [Smax/2 + 1, Smax]: the counts use this lower bound, so the time
    # floor holds for every draw (achieved GB/s is then understated by up to 2x).
    return max_seq_len // 2 + 1


def flop_count() -> float:
    # Per (query head, valid position): 2*D for q.k, 2*D for p*v, ~5 for the softmax.
    return float(batch_size * num_q_heads * _min_len() * (4 * head_dim + 5))


def byte_count() -> float:
    # bf16: read the valid prefix of both caches (2 * B*Hkv*len*D), q and the output
    # (2 * B*Hq*D), and the lengths (4*B).
    cache = 2 * batch_size * num_kv_heads * _min_len() * head_dim
    return float(2 * cache + 2 * 2 * batch_size * num_q_heads * head_dim + 4 * batch_size)
