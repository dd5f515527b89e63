# expected: runtime_error
# backend: torch
"""Known-failing candidate: plain PyTorch that broadcasts the pair bias along the wrong axis
(unsqueeze(2) instead of unsqueeze(1)), so the addition raises a size mismatch on every call."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, pair_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = pair_dim // num_heads
        self.layer_norm = nn.LayerNorm(pair_dim)
        self.query = nn.Linear(pair_dim, pair_dim, bias=False)
        self.key = nn.Linear(pair_dim, pair_dim, bias=False)
        self.value = nn.Linear(pair_dim, pair_dim, bias=False)
        self.gate = nn.Linear(pair_dim, pair_dim)
        self.bias_proj = nn.Linear(pair_dim, num_heads, bias=False)
        self.out_proj = nn.Linear(pair_dim, pair_dim)

    def forward(self, pair_repr: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        B, N, _, D = pair_repr.shape
        h, d = self.num_heads, self.head_dim
        x = self.layer_norm(pair_repr)
        g = torch.sigmoid(self.gate(x))
        bias = self.bias_proj(x).permute(0, 3, 1, 2)  # (B, h, N, N)
        x_flat = x.reshape(B * N, N, D)
        q = self.query(x_flat).view(B * N, N, h, d).transpose(1, 2)
        k = self.key(x_flat).view(B * N, N, h, d).transpose(1, 2)
        v = self.value(x_flat).view(B * N, N, h, d).transpose(1, 2)
        attn = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        # BUG: bias.unsqueeze(2) is (B, h, 1, N, N); the scores are (B, N, h, N, N)
        attn = attn.view(B, N, h, N, N) + bias.unsqueeze(2)
        attn = attn.masked_fill(pair_mask[:, None, None] == 0, float("-inf"))
        attn = F.softmax(attn.view(B * N, h, N, N), dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(B, N, N, D)
        return self.out_proj(g * out)
