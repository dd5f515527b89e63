"""Multi-head latent attention decode with absorbed weights, as DeepSeek-V3 serves it (bf16)."""

import torch
import torch.nn as nn

NAME = "mla_decode_attention"
DESCRIPTION = (
    "A decode step of DeepSeek-V3 multi-head latent attention in the weight-absorbed form "
    "FlashMLA computes, in bfloat16: 64 sequences, 128 query heads, one query token each. "
    "Every head's query q (576 = 512 latent + 64 rotary dims) attends to a shared per-sequence "
    "cache of 576-dim entries (the compressed KV latent and the rotary key), up to "
    "cache_seqlens[b] (2049..4096) positions; the value is the first 512 dims of each cache "
    "entry. Scale 1/sqrt(192) (DeepSeek-V3's qk head dim), scores and softmax in float32. "
    "Compute- and memory-heavy at once: all 128 heads share one cache read."
)
TAGS = ["attention", "decode", "kv-cache", "mla", "deepseek"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_size = 64
max_seq_len = 4096
num_heads = 128
kv_lora_rank = 512
rope_dim = 64
softmax_scale = 192**-0.5

SHAPE_SETS = {
    "public": {"batch_size": 64, "max_seq_len": 4096, "num_heads": 128},
    "heldout_long": {"batch_size": 8, "max_seq_len": 32768, "num_heads": 128},
    "heldout_tp8": {"batch_size": 128, "max_seq_len": 4096, "num_heads": 16},
    "tiny": {
        "batch_size": 2,
        "max_seq_len": 32,
        "num_heads": 4,
        "kv_lora_rank": 32,
        "rope_dim": 8,
        "softmax_scale": 12**-0.5,  # keeps scores at std ~2.5 with 40-dim entries
    },
}


class Model(nn.Module):
    """q (B, H, R+P), kv_cache (B, Smax, R+P) bf16, cache_seqlens (B,) int32 -> (B, H, R) bf16.

    R is the latent rank (kv_lora_rank), P the rotary dims.
    """

    def __init__(self, kv_lora_rank: int, softmax_scale: float):
        super().__init__()
        self.rank = kv_lora_rank
        self.scale = softmax_scale

    def forward(
        self, q: torch.Tensor, kv_cache: torch.Tensor, cache_seqlens: torch.Tensor
    ) -> torch.Tensor:
        kv = kv_cache.float()
        scores = torch.einsum("bhc,bsc->bhs", q.float(), kv) * self.scale
        S = kv.shape[1]
        beyond = torch.arange(S, device=q.device)[None, :] >= cache_seqlens[:, None].long()
        scores = scores.masked_fill(beyond[:, None, :], float("-inf"))
        out = torch.einsum("bhs,bsr->bhr", scores.softmax(dim=-1), kv[..., : self.rank])
        return out.to(q.dtype)


def get_inputs():
    dim = kv_lora_rank + rope_dim
    # q of std 1.45 against unit cache entries gives scores of std ~2.5 at the real dims:
    # peaked attention, as in trained models.
    q = (1.45 * torch.randn(batch_size, num_heads, dim)).to(torch.bfloat16)
    kv_cache = torch.randn(batch_size, max_seq_len, dim, dtype=torch.bfloat16)
    low = max_seq_len // 2 + 1  # never a fully masked row
    cache_seqlens = torch.randint(low, max_seq_len + 1, (batch_size,), dtype=torch.int32)
    return [q, kv_cache, cache_seqlens]


def get_init_inputs():
    return [kv_lora_rank, softmax_scale]


def _min_len() -> int:
    # The counts use the shortest possible length, so the time floor holds for every draw.
    return max_seq_len // 2 + 1


def flop_count() -> float:
    # Per (head, valid position): 2*(R+P) for q.kv, 2*R for p*v, ~5 for the softmax.
    per = 2 * (kv_lora_rank + rope_dim) + 2 * kv_lora_rank + 5
    return float(batch_size * num_heads * _min_len() * per)


def byte_count() -> float:
    # bf16: the valid cache prefix once (B*len*(R+P)), shared by all heads; q (B*H*(R+P)) and
    # the output (B*H*R); the lengths (4*B).
    dim = kv_lora_rank + rope_dim
    cache = batch_size * _min_len() * dim
    return float(2 * (cache + batch_size * num_heads * (dim + kv_lora_rank)) + 4 * batch_size)
