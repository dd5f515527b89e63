"""Triangle self-attention over the rows of a pair representation (AlphaFold style).

For every row ``i`` of the pair representation ``z`` (B, N, N, D), the entries ``z[b, i, :]``
attend to each other with a gate and a per-head pair bias projected from ``z`` itself; keys masked
out by ``pair_mask`` get no weight.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "triangle_attention"
DESCRIPTION = (
    "Gated triangle self-attention over the rows of a pair representation (B, N, N, D), as in "
    "AlphaFold: LayerNorm, q/k/v projections, attention across each row's N entries with a "
    "per-head pair bias projected from the representation and a key mask, then a sigmoid gate "
    "and an output projection. The attention tensor (B, N, heads, N, N) dominates the eager "
    "reference's memory traffic."
)
TAGS = ["attention", "softmax", "masking", "layernorm", "fusion", "alphafold"]
DTYPE = "float32"
# The task asks for a custom kernel: the attention core (q.k^T, masked softmax with the pair
# bias, P@V) must be one. The LayerNorm and the linear projections around it may stay PyTorch's
# (mm/addmm, layer_norm); the core's operators, batched products and softmax, are forbidden.
POLICY = {
    "require_custom_kernel": True,
    "forbidden_ops": [
        "bmm",
        "baddbmm",
        "einsum",
        "_softmax",
        "softmax",
        "_safe_softmax",
        "_log_softmax",
        "log_softmax",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    ],
}

batch_size = 2
n_res = 64
pair_dim = 64
num_heads = 4

SHAPE_SETS = {
    "public": {"batch_size": 2, "n_res": 64, "pair_dim": 64, "num_heads": 4},
    "heldout_a": {"batch_size": 1, "n_res": 128, "pair_dim": 64, "num_heads": 4},
    "heldout_b": {"batch_size": 2, "n_res": 77, "pair_dim": 96, "num_heads": 3},
}


class Model(nn.Module):
    """Gated self-attention along the last-but-one axis of a pair representation."""

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
        # Weights of std 1/sqrt(fan_in) keep logits, biases and outputs O(1), so the attention
        # is neither uniform nor one-hot and errors are visible at fp32 tolerances.
        std = 1.0 / math.sqrt(pair_dim)
        for lin in (self.query, self.key, self.value, self.gate, self.bias_proj, self.out_proj):
            nn.init.normal_(lin.weight, std=std)

    def forward(self, pair_repr: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """pair_repr (B, N, N, D), pair_mask (B, N, N) of 0/1 -> (B, N, N, D)."""
        B, N, _, D = pair_repr.shape
        h = self.num_heads
        d = self.head_dim

        x = self.layer_norm(pair_repr)  # (B, N, N, D)
        g = torch.sigmoid(self.gate(x))  # (B, N, N, D)
        # Pair bias from the pair representation itself
        bias = self.bias_proj(x).permute(0, 3, 1, 2)  # (B, h, N, N)

        # Reshape to (B*N, N, D): attention across columns for each row
        x_flat = x.reshape(B * N, N, D)
        q = self.query(x_flat).view(B * N, N, h, d).transpose(1, 2)  # (B*N, h, N, d)
        k = self.key(x_flat).view(B * N, N, h, d).transpose(1, 2)
        v = self.value(x_flat).view(B * N, N, h, d).transpose(1, 2)

        attn = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # (B*N, h, N, N)
        attn = attn.view(B, N, h, N, N)
        # Add pair bias: bias (B, h, N, N) -> (B, 1, h, N, N), broadcast across rows
        attn = attn + bias.unsqueeze(1)
        mask = pair_mask.unsqueeze(1).unsqueeze(2)  # (B, 1, 1, N, N)
        attn = attn.masked_fill(mask == 0, float("-inf"))
        attn = attn.view(B * N, h, N, N)
        attn = F.softmax(attn, dim=-1)

        out = (attn @ v).transpose(1, 2).reshape(B, N, N, D)
        out = g * out
        return self.out_proj(out)


def get_inputs():
    pair_repr = torch.randn(batch_size, n_res, n_res, pair_dim)
    # About 10% of the keys masked; the diagonal is always kept, so no query loses every key.
    pair_mask = (torch.rand(batch_size, n_res, n_res) > 0.1).float()
    pair_mask[:, torch.arange(n_res), torch.arange(n_res)] = 1.0
    return [pair_repr, pair_mask]


def get_init_inputs():
    return [pair_dim, num_heads]


def flop_count() -> float:
    # 2 FLOPs per multiply-add, T = B*N*N pair entries:
    #   projections q, k, v, gate, out: 5 * 2*T*D*D; pair bias: 2*T*D*h
    #   q @ k^T and attn @ v over each row: 2 * 2*B*N*N*N*D
    #   softmax (max, sub, exp, sum, div): 5*B*h*N*N*N; LayerNorm ~ 8*T*D; gate sigmoid and
    #   multiply ~ 5*T*D
    B, N, D, h = batch_size, n_res, pair_dim, num_heads
    t = B * N * N
    proj = 5 * 2 * t * D * D + 2 * t * D * h
    attn = 2 * 2 * B * N * N * N * D
    softmax = 5 * B * h * N * N * N
    return float(proj + attn + softmax + 8 * t * D + 5 * t * D)


def byte_count() -> float:
    # fp32: read pair_repr (T*D), the mask (B*N*N) and the parameters (5*D*D + D*h + 4*D), write
    # the output (T*D); everything else can stay on chip.
    B, N, D, h = batch_size, n_res, pair_dim, num_heads
    t = B * N * N
    params = 5 * D * D + D * h + 4 * D
    return float(4 * (2 * t * D + B * N * N + params))
