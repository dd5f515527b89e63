"""A one-problem suite on the CPU with PyTorch-only candidates (no compiler): fast to judge."""

from __future__ import annotations

from pathlib import Path

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
"""

CANDIDATE = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return {expr}
"""


def write_suite(root: Path) -> Path:
    """``root/suite/relu.py``; returns the suite folder."""
    suite = root / "suite"
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "relu.py").write_text(PROBLEM)
    return suite


def write_candidate(cands: Path, sample: str, expr: str = "torch.relu(x)") -> Path:
    """``cands/relu/<sample>.py``, correct unless ``expr`` says otherwise; returns its path."""
    folder = cands / "relu"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{sample}.py"
    path.write_text(CANDIDATE.format(expr=expr))
    return path
