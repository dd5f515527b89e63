"""One decode step of grouped-query attention over a paged KV cache, as in vLLM (bf16)."""

import torch
import torch.nn as nn

NAME = "paged_decode_attention"
DESCRIPTION = (
    "vLLM's PagedAttention decode step at Llama 3 8B's head layout, in bfloat16: 32 sequences, "
    "one query token each (32 query heads, head_dim 128). The KV cache is a pool of blocks of "
    "16 positions, (num_blocks, 16, 8 KV heads, 128); block_tables[b, j] names the block "
    "holding positions 16j..16j+15 of sequence b, and seq_lens[b] (2049..4096) how many "
    "positions are valid. Query head h reads KV head h // 4, scale 1/sqrt(head_dim), scores "
    "and softmax in float32. Memory-bound, with an indirection per block."
)
TAGS = ["attention", "decode", "kv-cache", "paged", "gqa", "memory-bound", "vllm"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

batch_size = 32
max_seq_len = 4096
block_size = 16
num_q_heads = 32
num_kv_heads = 8
head_dim = 128

SHAPE_SETS = {
    "public": {"batch_size": 32, "max_seq_len": 4096, "block_size": 16},
    "heldout_long": {"batch_size": 4, "max_seq_len": 32768, "block_size": 32},
    "heldout_70b_tp8": {
        "batch_size": 64,
        "max_seq_len": 4096,
        "block_size": 16,
        "num_q_heads": 8,
        "num_kv_heads": 1,
    },
    "tiny": {
        "batch_size": 3,
        "max_seq_len": 32,
        "block_size": 4,
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
    },
}


class Model(nn.Module):
    """q (B, Hq, D); caches (NB, BS, Hkv, D) bf16; block_tables (B, Smax/BS), seq_lens (B,) int32.

    Returns (B, Hq, D) bf16.
    """

    def forward(
        self,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        B, Hq, D = q.shape
        Hkv = key_cache.shape[2]
        # Gather each sequence's blocks into a contiguous (B, Smax, Hkv, D) view.
        k = key_cache[block_tables.long()].flatten(1, 2).float()
        v = value_cache[block_tables.long()].flatten(1, 2).float()
        qg = q.float().view(B, Hkv, Hq // Hkv, D)
        scores = torch.einsum("bhgd,bshd->bhgs", qg, k) * D**-0.5
        beyond = torch.arange(k.shape[1], device=q.device)[None, :] >= seq_lens[:, None].long()
        scores = scores.masked_fill(beyond[:, None, None, :], float("-inf"))
        out = torch.einsum("bhgs,bshd->bhgd", scores.softmax(dim=-1), v)
        return out.reshape(B, Hq, D).to(q.dtype)


def get_inputs():
    blocks_per_seq = max_seq_len // block_size
    num_blocks = batch_size * blocks_per_seq
    q = (1.6 * torch.randn(batch_size, num_q_heads, head_dim)).to(torch.bfloat16)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = (1.6 * torch.randn(shape)).to(torch.bfloat16)  # scores of std ~2.5
    value_cache = torch.randn(shape, dtype=torch.bfloat16)
    # A random permutation of the pool: sequences own scattered, disjoint blocks.
    block_tables = torch.randperm(num_blocks).view(batch_size, blocks_per_seq).to(torch.int32)
    low = max_seq_len // 2 + 1  # never a fully masked row
    seq_lens = torch.randint(low, max_seq_len + 1, (batch_size,), dtype=torch.int32)
    return [q, key_cache, value_cache, block_tables, seq_lens]


def get_init_inputs():
    return []


def _min_len() -> int:
    # The counts use the shortest possible length, so the time floor holds for every draw.
    return max_seq_len // 2 + 1


def flop_count() -> float:
    # Per (query head, valid position): 2*D for q.k, 2*D for p*v, ~5 for the softmax.
    return float(batch_size * num_q_heads * _min_len() * (4 * head_dim + 5))


def byte_count() -> float:
    # bf16: the valid positions of both caches (2 * B*len*Hkv*D), q and the output
    # (2 * B*Hq*D); int32 block tables and lengths (4 * B*(Smax/BS + 1)).
    cache = 2 * batch_size * _min_len() * num_kv_heads * head_dim
    small = 2 * 2 * batch_size * num_q_heads * head_dim
    return float(2 * cache + small + 4 * batch_size * (max_seq_len // block_size + 1))
