"""Cumulative sum along long rows: the prefix sum of top-p (nucleus) sampling (fp32)."""

import torch
import torch.nn as nn

NAME = "cumsum"
DESCRIPTION = (
    "Inclusive cumulative sum along rows of 128256 float32 values: the prefix sum over a "
    "Llama 3 vocabulary's probabilities, sorted in descending order, that top-p (nucleus) "
    "sampling thresholds, for a serving batch of 256 sequences. A scan: each row is far "
    "longer than one thread block can hold, so a kernel needs a multi-block (decoupled "
    "look-back) or two-level scan."
)
TAGS = ["scan", "cumsum", "sampling", "memory-bound", "llama"]
DTYPE = "float32"

batch_size = 256
row_len = 128256

SHAPE_SETS = {
    "public": {"batch_size": 256, "row_len": 128256},
    "heldout_qwen": {"batch_size": 64, "row_len": 151936},
    "heldout_llama2": {"batch_size": 1024, "row_len": 32000},
    "tiny": {"batch_size": 4, "row_len": 256},
}


class Model(nn.Module):
    """x (B, L) fp32 -> (B, L) fp32, out[b, i] = sum_{j <= i} x[b, j]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def get_inputs():
    # Next-token distributions from logits of std 3 (peaked, as LMs are), sorted descending.
    probs = (3.0 * torch.randn(batch_size, row_len)).softmax(dim=-1)
    return [probs.sort(dim=-1, descending=True).values]


def get_init_inputs():
    return []


def flop_count() -> float:
    # One add per element.
    return float(batch_size * row_len)


def byte_count() -> float:
    # fp32: read x, write the prefix sums.
    return float(2 * 4 * batch_size * row_len)
