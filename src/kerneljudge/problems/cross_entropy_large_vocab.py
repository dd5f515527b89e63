"""Per-token cross-entropy over a 128k vocabulary, from bf16 logits (LLM training loss)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "cross_entropy_large_vocab"
DESCRIPTION = (
    "The language-modelling loss of Llama 3 (vocabulary 128256) for 4096 tokens: per-token "
    "cross-entropy loss[t] = logsumexp(logits[t]) - logits[t, target[t]] from bf16 logits, "
    "computed in float32, with targets of -100 ignored (loss 0). Returns the (T,) float32 "
    "losses. Memory-bound on one read of a 1 GB logits tensor; the reference also "
    "materialises a float32 copy."
)
TAGS = ["loss", "cross-entropy", "softmax", "reduction", "memory-bound", "llama"]
DTYPE = "bfloat16"

num_tokens = 4096
vocab_size = 128256
IGNORE_INDEX = -100

SHAPE_SETS = {
    "public": {"num_tokens": 4096, "vocab_size": 128256},
    "heldout_qwen": {"num_tokens": 2048, "vocab_size": 151936},  # Qwen2.5
    "heldout_gemma": {"num_tokens": 1000, "vocab_size": 262144},  # Gemma 3
    "tiny": {"num_tokens": 16, "vocab_size": 512},
}


class Model(nn.Module):
    """logits (T, V) bf16, targets (T,) int64 (-100 = ignore) -> loss (T,) float32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        acc = torch.promote_types(logits.dtype, torch.float32)
        return F.cross_entropy(logits.to(acc), targets, reduction="none", ignore_index=IGNORE_INDEX)


def get_inputs():
    logits = (2.0 * torch.randn(num_tokens, vocab_size)).to(torch.bfloat16)
    targets = torch.randint(0, vocab_size, (num_tokens,))
    targets[torch.rand(num_tokens) < 0.05] = IGNORE_INDEX  # padding / prompt tokens
    return [logits, targets]


def get_init_inputs():
    return []


def flop_count() -> float:
    # logsumexp: max, subtract, exp, sum per logit (4*T*V); the target gather and subtract
    # are negligible.
    return float(4 * num_tokens * vocab_size)


def byte_count() -> float:
    # Read bf16 logits (2*T*V) and int64 targets (8*T), write float32 losses (4*T).
    return float(2 * num_tokens * vocab_size + 12 * num_tokens)
