"""LM head projection fused with the cross-entropy loss, never materialising logits (bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "fused_linear_cross_entropy"
DESCRIPTION = (
    "The output layer and loss of Llama 3 8B training (hidden 4096, vocabulary 128256) for "
    "4096 tokens: logits = hidden @ lm_head^T in bfloat16 (float32 accumulation, rounded to "
    "bf16), then per-token cross-entropy in float32. Returns the (T,) float32 losses. The "
    "reference materialises 1 GB of bf16 logits and a float32 copy; a fused kernel (Liger, "
    "Apple's Cut Cross-Entropy) streams vocabulary tiles through an online logsumexp."
)
TAGS = ["loss", "cross-entropy", "gemm", "fusion", "llama"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

num_tokens = 4096
hidden_size = 4096
vocab_size = 128256

SHAPE_SETS = {
    "public": {"num_tokens": 4096, "hidden_size": 4096, "vocab_size": 128256},
    "heldout_qwen": {"num_tokens": 2048, "hidden_size": 3584, "vocab_size": 152064},
    "heldout_1b": {"num_tokens": 8192, "hidden_size": 2048, "vocab_size": 128256},
    "tiny": {"num_tokens": 8, "hidden_size": 32, "vocab_size": 256},
}


class Model(nn.Module):
    """hidden (T, H) bf16, targets (T,) int64 -> loss (T,) float32; lm_head (V, H) bf16."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        # std 2/sqrt(H): logits of std ~2, as a trained LM head gives.
        w = 2.0 * hidden_size**-0.5 * torch.randn(vocab_size, hidden_size)
        self.lm_head = nn.Parameter(w.to(torch.bfloat16))

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = hidden @ self.lm_head.T
        acc = torch.promote_types(logits.dtype, torch.float32)
        return F.cross_entropy(logits.to(acc), targets, reduction="none")


def get_inputs():
    hidden = torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16)
    targets = torch.randint(0, vocab_size, (num_tokens,))
    return [hidden, targets]


def get_init_inputs():
    return [hidden_size, vocab_size]


def flop_count() -> float:
    # The GEMM 2*T*V*H, plus ~4 per logit for the logsumexp.
    return float(2 * num_tokens * vocab_size * hidden_size + 4 * num_tokens * vocab_size)


def byte_count() -> float:
    # bf16 lm_head (2*V*H) and hidden (2*T*H), int64 targets (8*T), float32 losses (4*T).
    return float(2 * vocab_size * hidden_size + 2 * num_tokens * hidden_size + 12 * num_tokens)
