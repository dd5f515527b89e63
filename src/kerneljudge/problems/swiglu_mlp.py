"""The SwiGLU feed-forward block of Llama 3 8B (bf16)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "swiglu_mlp"
DESCRIPTION = (
    "The SwiGLU MLP of Llama 3 8B (hidden 4096, intermediate 14336, no biases) over a prefill "
    "of 2048 tokens in bfloat16: y = down(silu(gate(x)) * up(x)). Three GEMMs; a fused kernel "
    "keeps the (tokens, 14336) intermediate on chip or fuses the activation into the GEMMs."
)
TAGS = ["mlp", "swiglu", "gemm", "fusion", "llama"]
DTYPE = "bfloat16"
POLICY = {"require_custom_kernel": True}

num_tokens = 2048
hidden_size = 4096
intermediate_size = 14336

SHAPE_SETS = {
    "public": {"num_tokens": 2048, "hidden_size": 4096, "intermediate_size": 14336},
    # Llama 3 70B MLP sharded 8 ways (tensor parallel): intermediate 28672 / 8.
    "heldout_70b_tp8": {"num_tokens": 4096, "hidden_size": 8192, "intermediate_size": 3584},
    # Qwen2.5 7B, ragged token count.
    "heldout_qwen": {"num_tokens": 1000, "hidden_size": 3584, "intermediate_size": 18944},
    "tiny": {"num_tokens": 8, "hidden_size": 64, "intermediate_size": 96},
}


class Model(nn.Module):
    """x (T, H) bf16 -> (T, H) bf16; gate/up weights (I, H), down weight (H, I), bf16."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=torch.bfloat16)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=False, dtype=torch.bfloat16)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False, dtype=torch.bfloat16)
        # std 1/sqrt(fan_in) keeps every activation O(1), well above bf16 tolerances.
        for lin in (self.gate, self.up, self.down):
            nn.init.normal_(lin.weight, std=lin.in_features**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(num_tokens, hidden_size, dtype=torch.bfloat16)]


def get_init_inputs():
    return [hidden_size, intermediate_size]


def flop_count() -> float:
    # Three GEMMs of T x H x N at 2 FLOPs per multiply-add, plus silu and product (~5 per
    # intermediate element): 6*T*H*N + 5*T*N.
    T, H, N = num_tokens, hidden_size, intermediate_size
    return float(6 * T * H * N + 5 * T * N)


def byte_count() -> float:
    # bf16: read the three weights (3*H*N) and x (T*H), write y (T*H).
    return float(2 * (3 * hidden_size * intermediate_size + 2 * num_tokens * hidden_size))
