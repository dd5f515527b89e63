"""Dynamic per-tensor FP8 (e4m3) quantisation of bf16 activations, as FP8 inference runs it."""

import torch
import torch.nn as nn

NAME = "fp8_per_tensor_quant"
DESCRIPTION = (
    "Dynamic per-tensor FP8 quantisation of a bf16 activation (8192 tokens x 8192, the input "
    "of a Llama 3 70B projection) as vLLM's scaled_fp8_quant does it before an FP8 GEMM: "
    "scale = max|x| / 448 (float32, 448 the largest float8_e4m3fn), "
    "y = float8_e4m3fn(clamp(x / scale, -448, 448)) with round-to-nearest-even. Returns "
    "(y (T, H) float8_e4m3fn, scale (1,) float32). A global reduction, then a cast: two passes "
    "over x, or one pass with the max computed by a first grid and the cast by a second."
)
TAGS = ["quantization", "fp8", "reduction", "elementwise", "memory-bound", "vllm"]
DTYPE = "bfloat16"
# An e4m3 value carries 3 mantissa bits: one rounding step is up to 12.5% of a normal value
# and 2^-9 among the subnormals. A quotient computed another way (x * (1 / scale)) may round
# the other way near a tie, so allow one step.
TOLERANCE = {"atol": 2.0**-9, "rtol": 0.125}

num_tokens = 8192
hidden_size = 8192

SHAPE_SETS = {
    "public": {"num_tokens": 8192, "hidden_size": 8192},
    "heldout_mlp": {"num_tokens": 4096, "hidden_size": 14336},  # Llama 3 8B down-proj input
    "heldout_odd": {"num_tokens": 3001, "hidden_size": 7168},  # DeepSeek-V3 hidden
    "tiny": {"num_tokens": 16, "hidden_size": 64},
}

FP8_MAX = 448.0


class Model(nn.Module):
    """x (T, H) bf16 -> (y (T, H) float8_e4m3fn, scale (1,) float32)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc = torch.promote_types(x.dtype, torch.float32)
        scale = (x.abs().amax().to(acc) / FP8_MAX).clamp_min(1e-12).reshape(1)
        y = (x.to(acc) / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return y, scale


def get_inputs():
    # Activations with a few large outliers per token, as in real LLM residual streams.
    x = torch.randn(num_tokens, hidden_size)
    x = x * (1.0 + 8.0 * (torch.rand(num_tokens, hidden_size) > 0.999).float())
    return [x.to(torch.bfloat16)]


def get_init_inputs():
    return []


def flop_count() -> float:
    # abs and max per element (2), divide and clamp per element (2): 4 * T*H.
    return float(4 * num_tokens * hidden_size)


def byte_count() -> float:
    # Read x once (2*T*H, a lower bound: x does not fit in L2, so a two-pass kernel reads it
    # twice), write y (T*H) and the scale (4).
    return float(3 * num_tokens * hidden_size + 4)
