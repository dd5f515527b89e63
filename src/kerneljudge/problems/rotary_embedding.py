"""Rotary position embedding of queries and keys, vLLM-style with a cos/sin cache (bf16)."""

import torch
import torch.nn as nn

NAME = "rotary_embedding"
DESCRIPTION = (
    "Rotary position embedding (RoPE, NeoX 'rotate-half' layout) of Llama 3 8B in bfloat16, "
    "applied to the query and key projections of a batch of 16384 tokens at arbitrary "
    "positions: query (T, 32 heads, 128) and key (T, 8 heads, 128). A float32 buffer "
    "cos_sin_cache (max_position, 128) holds cos(p * f_i) in its first 64 columns and "
    "sin(p * f_i) in the last 64, with f_i = 500000^(-2i/128); for x = [x1, x2] split in "
    "halves, out = [x1 cos - x2 sin, x2 cos + x1 sin], computed in float32, rounded to bf16."
)
TAGS = ["attention", "rope", "elementwise", "memory-bound", "llama", "vllm"]
DTYPE = "bfloat16"

num_tokens = 16384
num_q_heads = 32
num_kv_heads = 8
head_dim = 128
max_position = 131072  # Llama 3.1's 128k context
rope_theta = 500000.0

SHAPE_SETS = {
    "public": {"num_tokens": 16384, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128},
    "heldout_70b": {"num_tokens": 8192, "num_q_heads": 64, "num_kv_heads": 8, "head_dim": 128},
    "heldout_odd": {"num_tokens": 9999, "num_q_heads": 28, "num_kv_heads": 4, "head_dim": 128},
    "tiny": {
        "num_tokens": 16,
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "max_position": 64,
    },
}


class Model(nn.Module):
    """positions (T,) int64, query (T, Hq, D), key (T, Hkv, D) bf16 -> (query', key') bf16."""

    cos_sin_cache: torch.Tensor  # (P, D) fp32, a buffer: cos in the first half, sin in the second

    def __init__(self, head_dim: int, max_position: int, rope_theta: float):
        super().__init__()
        inv_freq = rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
        cache = torch.cat([angles.cos(), angles.sin()], dim=-1).float()  # (P, D)
        self.register_buffer("cos_sin_cache", cache)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # (T, 1, D/2)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)


def get_inputs():
    positions = torch.randint(0, max_position, (num_tokens,))
    query = torch.randn(num_tokens, num_q_heads, head_dim, dtype=torch.bfloat16)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, dtype=torch.bfloat16)
    return [positions, query, key]


def get_init_inputs():
    return [head_dim, max_position, rope_theta]


def flop_count() -> float:
    # Per element of query and key: two multiplies and one add (the rotation): 3 * T*(Hq+Hkv)*D.
    return float(3 * num_tokens * (num_q_heads + num_kv_heads) * head_dim)


def byte_count() -> float:
    # bf16: read and write query and key (2 * 2 * T*(Hq+Hkv)*D); int64 positions (8*T); one
    # float32 cache row per token (4*T*D).
    qk = num_tokens * (num_q_heads + num_kv_heads) * head_dim
    return float(2 * 2 * qk + 8 * num_tokens + 4 * num_tokens * head_dim)
