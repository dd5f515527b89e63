"""AlphaFold's triangle multiplicative update with outgoing edges (fp32)."""

import torch
import torch.nn as nn

NAME = "triangle_multiplication"
DESCRIPTION = (
    "AlphaFold 2's triangle multiplicative update using outgoing edges (Jumper et al. 2021, "
    "supplement Algorithm 11) on a 384-residue crop, pair channels 128, hidden 128, float32: "
    "z' = LayerNorm(z); a = sigmoid(Wag z') * (Wap z') * mask, b likewise; "
    "x[i, j] = sum_k a[i, k] * b[j, k] per channel; out = sigmoid(Wg z') * Wo LayerNorm(x). "
    "The k-contraction is a batched GEMM per channel; the projections, gates and norms around "
    "it are what a fused kernel saves."
)
TAGS = ["science", "alphafold", "triangle", "gemm", "layernorm", "fusion"]
DTYPE = "float32"
POLICY = {"require_custom_kernel": True}

batch_size = 1
n_res = 384
pair_dim = 128
hidden_dim = 128

SHAPE_SETS = {
    "public": {"batch_size": 1, "n_res": 384},
    "heldout_train": {"batch_size": 2, "n_res": 256},  # AlphaFold 2 initial-training crop
    "heldout_odd": {"batch_size": 1, "n_res": 301, "pair_dim": 64, "hidden_dim": 64},
    "tiny": {"batch_size": 1, "n_res": 12, "pair_dim": 16, "hidden_dim": 16},
}


def _layer_norm(dim: int) -> nn.LayerNorm:
    ln = nn.LayerNorm(dim)
    nn.init.normal_(ln.weight, mean=1.0, std=0.2)  # trained values, not the identity init
    nn.init.normal_(ln.bias, std=0.2)
    return ln


class Model(nn.Module):
    """z (B, N, N, C) fp32, mask (B, N, N) fp32 of 0/1 -> (B, N, N, C) fp32."""

    def __init__(self, pair_dim: int, hidden_dim: int):
        super().__init__()
        self.norm_in = _layer_norm(pair_dim)
        self.a_gate = nn.Linear(pair_dim, hidden_dim)
        self.a_proj = nn.Linear(pair_dim, hidden_dim)
        self.b_gate = nn.Linear(pair_dim, hidden_dim)
        self.b_proj = nn.Linear(pair_dim, hidden_dim)
        self.norm_out = _layer_norm(hidden_dim)
        self.out_proj = nn.Linear(hidden_dim, pair_dim)
        self.out_gate = nn.Linear(pair_dim, pair_dim)
        lins = (self.a_gate, self.a_proj, self.b_gate, self.b_proj, self.out_proj, self.out_gate)
        for lin in lins:
            nn.init.normal_(lin.weight, std=lin.in_features**-0.5)
            nn.init.normal_(lin.bias, std=0.2)

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.norm_in(z)
        m = mask.unsqueeze(-1)
        a = torch.sigmoid(self.a_gate(z)) * self.a_proj(z) * m  # (B, N, N, c)
        b = torch.sigmoid(self.b_gate(z)) * self.b_proj(z) * m
        x = torch.einsum("bikc,bjkc->bijc", a, b)  # outgoing edges: contract over k
        return torch.sigmoid(self.out_gate(z)) * self.out_proj(self.norm_out(x))


def get_inputs():
    z = torch.randn(batch_size, n_res, n_res, pair_dim)
    mask = (torch.rand(batch_size, n_res, n_res) > 0.1).float()  # ~10% of pairs padded out
    return [z, mask]


def get_init_inputs():
    return [pair_dim, hidden_dim]


def flop_count() -> float:
    # P = B*N*N pairs. Projections: 4 of C -> c and the gate C -> C, the output c -> C, at
    # 2 FLOPs per multiply-add: 2*P*(4*C*c + C*C + c*C). Contraction: 2*B*N^3*c. Two
    # LayerNorms (~8 per element), sigmoids, gates and mask (~20 per pair channel).
    B, N, C, c = batch_size, n_res, pair_dim, hidden_dim
    P = B * N * N
    return float(
        2 * P * (4 * C * c + C * C + c * C) + 2 * B * N**3 * c + 8 * P * (C + c) + 20 * P * c
    )


def byte_count() -> float:
    # fp32: read z (P*C) and the mask (P), write the output (P*C); the parameters are small.
    # a and b (2*P*c) must be written and read back once: the contraction needs all of them.
    B, N, C, c = batch_size, n_res, pair_dim, hidden_dim
    P = B * N * N
    return float(4 * (2 * P * C + P + 4 * P * c))
