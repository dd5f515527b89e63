"""A CPU problem large enough for torch's intra-op threads to split it: Linear -> GELU (fp32)."""

import torch
import torch.nn as nn

NAME = "cpu_linear_gelu"
DESCRIPTION = "y = gelu(x W^T + b) for x (256, 512) and W (512, 512), float32."
batch = 256
features = 512
SHAPE_SETS = {"public": {"batch": 256}}


class Model(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.lin = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.lin(x))


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [features]


def flop_count() -> float:
    return 2.0 * batch * features * features + 8.0 * batch * features
