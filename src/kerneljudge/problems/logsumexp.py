"""Row logsumexp over a vocabulary: the softmax normaliser of LM losses and samplers (fp32)."""

import torch
import torch.nn as nn

NAME = "logsumexp"
DESCRIPTION = (
    "Row logsumexp over Llama 3's vocabulary (128256 logits per row) for 1024 tokens in "
    "float32: lse = max(x) + log(sum(exp(x - max(x)))), the normaliser of a cross-entropy loss "
    "or a sampler. Rows vary in temperature and offset, as real logits do. A reduction of a "
    "long row to one value: memory-bound on one read."
)
TAGS = ["reduction", "logsumexp", "softmax", "memory-bound", "llama"]
DTYPE = "float32"

batch_size = 1024
row_len = 128256

SHAPE_SETS = {
    "public": {"batch_size": 1024, "row_len": 128256},
    "heldout_llama2": {"batch_size": 4096, "row_len": 32000},
    "heldout_qwen": {"batch_size": 333, "row_len": 151936},
    "tiny": {"batch_size": 8, "row_len": 512},
}


class Model(nn.Module):
    """x (B, L) fp32 -> (B,) fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=-1)


def get_inputs():
    # Per-row scale (temperature) in [0.5, 4.5) and offset of std 5: without them every row's
    # logsumexp would be log(L) + 1/2 to within 0.01, and a constant would pass.
    scale = 0.5 + 4.0 * torch.rand(batch_size, 1)
    offset = 5.0 * torch.randn(batch_size, 1)
    return [scale * torch.randn(batch_size, row_len) + offset]


def get_init_inputs():
    return []


def flop_count() -> float:
    # max, subtract, exp, sum per element; the final log is per row.
    return float(4 * batch_size * row_len)


def byte_count() -> float:
    # fp32: read x (4*B*L), write one value per row (4*B).
    return float(4 * batch_size * row_len + 4 * batch_size)
