"""Softmax over rows of a 128k vocabulary: the sampling distribution of an LLM (fp32)."""

import torch
import torch.nn as nn

NAME = "softmax_long_row"
DESCRIPTION = (
    "Row softmax over Llama 3's vocabulary (128256 logits per row) for a serving batch of 256 "
    "sequences in float32, as a sampler computes next-token probabilities: "
    "p = exp(x - max(x)) / sum(exp(x - max(x))). Rows are far longer than one thread block "
    "holds: a kernel needs an online (single-pass) max and sum, or a split reduction."
)
TAGS = ["softmax", "reduction", "sampling", "memory-bound", "llama"]
DTYPE = "float32"
# Probabilities average 1/128256 ~ 8e-6, below the default atol of 1e-4: an all-zeros output
# would pass. Judge them relative to their own size instead.
TOLERANCE = {"atol": 1e-8, "rtol": 1e-4}

batch_size = 256
row_len = 128256

SHAPE_SETS = {
    "public": {"batch_size": 256, "row_len": 128256},
    "heldout_gemma": {"batch_size": 64, "row_len": 262144},
    "heldout_short": {"batch_size": 1024, "row_len": 32000},
    "tiny": {"batch_size": 4, "row_len": 1000},
}


class Model(nn.Module):
    """x (B, L) fp32 -> (B, L) fp32, each row summing to 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    # Logits of std 3 with a per-row offset: peaked distributions, and the max subtraction
    # matters (exp(x) would overflow for the largest offsets without it).
    return [3.0 * torch.randn(batch_size, row_len) + 40.0 * torch.randn(batch_size, 1)]


def get_init_inputs():
    return []


def flop_count() -> float:
    # max, subtract, exp, sum, divide per element.
    return float(5 * batch_size * row_len)


def byte_count() -> float:
    # fp32: read x, write p.
    return float(2 * 4 * batch_size * row_len)
