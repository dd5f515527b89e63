"""GPU tier: a CUDA judge takes its probe (on the ``meta`` device), its reference worker and its
candidate workers from spares started ahead of the problem, with their CUDA contexts made."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kerneljudge.judge import Judge, JudgeConfig
from kerneljudge.worker.spares import Spares

pytestmark = pytest.mark.gpu

PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.tril(x) * {factor}

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
"""


def test_a_cuda_judge_takes_every_process_it_needs_from_the_spares(tmp_path: Path) -> None:
    config = JudgeConfig(device="cuda", trials=2, baselines=("eager",), graph_timing=False)
    spares = Spares()
    try:
        for factor in (2, 3):
            problem = tmp_path / f"tril_{factor}.py"
            problem.write_text(textwrap.dedent(PROBLEM.format(factor=factor)))
            candidate = problem.with_name(f"tril_{factor}_candidate.py")
            candidate.write_text(problem.read_text().replace("class Model", "class ModelNew"))
            before = {id(s) for s in spares.kept()}
            with Judge(problem, config, spares=spares) as judge:
                taken = before - {id(s) for s in spares.kept()}
                verdict = judge.evaluate(candidate)
            assert verdict.status == "correct", verdict.reason
            assert len(taken) == (0 if factor == 2 else 4)  # probe, reference, 2 candidates
            spares.refill()
            spares.wait_ready()
    finally:
        spares.close()
