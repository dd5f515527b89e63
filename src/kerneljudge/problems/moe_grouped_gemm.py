"""Mixture-of-experts token permutation, grouped GEMM and weighted combine (bf16)."""

import torch
import torch.nn as nn

NAME = "moe_grouped_gemm"
DESCRIPTION = (
    "The expert projection of OLMoE-1B-7B (64 experts, top 8, hidden 2048 -> 1024 per "
    "expert) over 4096 tokens in bfloat16: every token is sent to its 8 experts "
    "(topk_ids), each expert multiplies the rows it received by its own weight (a grouped GEMM "
    "over uneven groups), and the 8 results are combined with the router weights: "
    "out[t] = sum_j topk_weights[t, j] * (x[t] @ W[topk_ids[t, j]]^T); each expert's result "
    "is rounded to bf16 (as vLLM's fused_moe writes it) and the combine runs in float32. The "
    "reference permutes tokens by expert and loops over experts."
)
TAGS = ["moe", "grouped-gemm", "permutation", "gemm", "olmoe"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

num_tokens = 4096
num_experts = 64
top_k = 8
hidden_size = 2048
expert_size = 1024

SHAPE_SETS = {
    "public": {"num_tokens": 4096, "num_experts": 64, "top_k": 8},
    # Mixtral 8x7B routing (8 experts, top 2), experts sharded 4 ways.
    "heldout_mixtral_tp4": {
        "num_tokens": 8192,
        "num_experts": 8,
        "top_k": 2,
        "hidden_size": 4096,
        "expert_size": 3584,
    },
    # Qwen3-30B-A3B (128 experts, top 8, 768 per expert), ragged token count.
    "heldout_qwen3": {
        "num_tokens": 3000,
        "num_experts": 128,
        "top_k": 8,
        "expert_size": 768,
    },
    "tiny": {
        "num_tokens": 16,
        "num_experts": 4,
        "top_k": 2,
        "hidden_size": 32,
        "expert_size": 48,
    },
}


class Model(nn.Module):
    """x (T, H) bf16, topk_ids (T, k) int64, topk_weights (T, k) fp32 -> (T, N) bf16.

    The expert weights are one (E, N, H) bf16 parameter (each expert a Linear's weight).
    """

    def __init__(self, num_experts: int, hidden_size: int, expert_size: int):
        super().__init__()
        w = torch.randn(num_experts, expert_size, hidden_size) * hidden_size**-0.5
        self.weight = nn.Parameter(w.to(torch.bfloat16))

    def forward(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        T, k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (T*k,) slots grouped by expert
        rows = x[order // k]  # permuted copy of the tokens, (T*k, H)
        counts = torch.bincount(flat, minlength=self.weight.shape[0]).tolist()
        acc = torch.promote_types(x.dtype, torch.float32)
        out_sorted = torch.empty(T * k, self.weight.shape[1], dtype=acc, device=x.device)
        start = 0
        for e, n in enumerate(counts):
            if n:
                out_sorted[start : start + n] = rows[start : start + n] @ self.weight[e].T
                start += n
        out = torch.empty_like(out_sorted)
        out[order] = out_sorted  # un-permute: back to (token, slot) order
        combined = (out.view(T, k, -1) * topk_weights.to(acc).unsqueeze(-1)).sum(dim=1)
        return combined.to(x.dtype)


def get_inputs():
    x = torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16)
    # k distinct experts per token, uniformly at random; weights positive, summing to 1.
    topk_ids = torch.argsort(torch.rand(num_tokens, num_experts), dim=-1)[:, :top_k]
    topk_weights = torch.rand(num_tokens, top_k) + 0.1
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return [x, topk_ids, topk_weights]


def get_init_inputs():
    return [num_experts, hidden_size, expert_size]


def flop_count() -> float:
    # T*k rows, each an H x N GEMV (2 FLOPs per multiply-add), plus the weighted combine.
    rows = num_tokens * top_k
    return float(2 * rows * hidden_size * expert_size + 2 * rows * expert_size)


def byte_count() -> float:
    # bf16 expert weights (2*E*N*H) and x (2*T*H), int64 ids and fp32 weights (12*T*k),
    # bf16 output (2*T*N).
    T, k, H, N = num_tokens, top_k, hidden_size, expert_size
    return float(2 * num_experts * N * H + 2 * T * H + 12 * T * k + 2 * T * N)
