"""The GPT-2 feed-forward block: Linear, tanh-approximated GELU, Linear (fp32)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

NAME = "gelu_tanh_mlp"
DESCRIPTION = (
    "The MLP of GPT-2 XL (hidden 1600, intermediate 6400, with biases) over 2 sequences of 1024 "
    "tokens in float32: y = fc2(gelu_tanh(fc1(x))), where gelu_tanh(u) = 0.5 u (1 + tanh("
    "sqrt(2/pi) (u + 0.044715 u^3))), the 'gelu_new' / gelu_pytorch_tanh of GPT-2 and Gemma. "
    "Full fp32: TF32 tensor cores are too coarse for the 1e-4 tolerance."
)
TAGS = ["mlp", "gelu", "gemm", "fusion", "gpt2"]
DTYPE = "float32"

num_tokens = 2048
hidden_size = 1600
intermediate_size = 6400

SHAPE_SETS = {
    "public": {"num_tokens": 2048, "hidden_size": 1600, "intermediate_size": 6400},
    "heldout_medium": {"num_tokens": 4096, "hidden_size": 1024, "intermediate_size": 4096},
    "heldout_vith": {"num_tokens": 16 * 257, "hidden_size": 1280, "intermediate_size": 5120},
    "tiny": {"num_tokens": 8, "hidden_size": 32, "intermediate_size": 128},
}


class Model(nn.Module):
    """x (T, H) fp32 -> (T, H) fp32; fc1 (I, H) + bias (I,), fc2 (H, I) + bias (H,)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, intermediate_size)
        self.fc2 = nn.Linear(intermediate_size, hidden_size)
        for lin in (self.fc1, self.fc2):
            nn.init.normal_(lin.weight, std=lin.in_features**-0.5)
            nn.init.normal_(lin.bias, std=0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def get_inputs():
    return [torch.randn(num_tokens, hidden_size)]


def get_init_inputs():
    return [hidden_size, intermediate_size]


def flop_count() -> float:
    # Two GEMMs of T x H x N (2 FLOPs per multiply-add): 4*T*H*N; biases T*(N+H); tanh-GELU
    # about 8 FLOPs per intermediate element.
    T, H, N = num_tokens, hidden_size, intermediate_size
    return float(4 * T * H * N + T * (N + H) + 8 * T * N)


def byte_count() -> float:
    # fp32: read both weights and biases (2*H*N + N + H) and x (T*H), write y (T*H).
    T, H, N = num_tokens, hidden_size, intermediate_size
    return float(4 * (2 * H * N + N + H + 2 * T * H))
