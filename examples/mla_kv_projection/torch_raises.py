# expected: runtime_error
# backend: torch
"""Known-failing candidate: plain PyTorch that multiplies by the wrong weight, so the matmul
raises a shape error on every call."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(
        self,
        hidden: torch.Tensor,
        w_down: torch.Tensor,
        w_up_k: torch.Tensor,
        w_up_v: torch.Tensor,
    ) -> torch.Tensor:
        B, S, M = hidden.shape
        latent = hidden.reshape(B * S, M) @ w_up_k  # BUG: (M) x (R, H*D): shapes do not match
        k = latent @ w_up_k
        v = latent @ w_up_v
        return torch.stack((k.view(B, S, 4, -1), v.view(B, S, 4, -1)), dim=2)
