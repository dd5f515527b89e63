"""Top-k softmax routing of a mixture-of-experts layer, as vLLM's topk_softmax kernel does it."""

import torch
import torch.nn as nn

NAME = "moe_router_topk"
DESCRIPTION = (
    "The router of Qwen3-235B-A22B's mixture-of-experts layers (128 experts, top 8) over "
    "65536 tokens in float32: softmax over each token's gating logits, pick the 8 largest "
    "probabilities (in descending order), renormalise them to sum to 1. Returns (weights "
    "(T, 8) float32, expert ids (T, 8) int64); ids are compared exactly. Logits have distinct "
    "values per token, so the top 8 are unambiguous."
)
TAGS = ["moe", "router", "softmax", "topk", "memory-bound", "qwen"]
DTYPE = "float32"

num_tokens = 65536
num_experts = 128
top_k = 8

SHAPE_SETS = {
    "public": {"num_tokens": 65536, "num_experts": 128, "top_k": 8},
    "heldout_dsv2lite": {"num_tokens": 131072, "num_experts": 64, "top_k": 6},
    "heldout_256": {"num_tokens": 33333, "num_experts": 256, "top_k": 8},  # DeepSeek-V3 count
    "tiny": {"num_tokens": 16, "num_experts": 16, "top_k": 4},
}


class Model(nn.Module):
    """logits (T, E) fp32 -> (weights (T, k) fp32, ids (T, k) int64)."""

    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = logits.softmax(dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1, sorted=True)
        return weights / weights.sum(dim=-1, keepdim=True), ids


def get_inputs():
    # Each token's logits are a random permutation of E evenly spaced levels in [-3, 3) plus a
    # jitter below half a level: distinct values at least 3/E apart, so no rounding flips the
    # choice of experts.
    level = 6.0 / num_experts
    ranks = torch.argsort(torch.rand(num_tokens, num_experts), dim=-1).float()
    logits = -3.0 + level * (ranks + 0.5 * torch.rand(num_tokens, num_experts))
    return [logits]


def get_init_inputs():
    return [top_k]


def flop_count() -> float:
    # Softmax ~5 per logit (max, subtract, exp, sum, divide), top-k ~1 compare per logit,
    # renormalisation 2 per chosen weight: 6*T*E + 2*T*k.
    return float(6 * num_tokens * num_experts + 2 * num_tokens * top_k)


def byte_count() -> float:
    # Read the fp32 logits (4*T*E); write fp32 weights and int64 ids (12*T*k).
    return float(4 * num_tokens * num_experts + 12 * num_tokens * top_k)
