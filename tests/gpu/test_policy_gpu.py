"""GPU tier: a policy problem's candidate worker comes up on the GPU already recording-ready
(its ``--record-ops`` start-up runs a CUDA op under the operator recorder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig
from kerneljudge.device import resolve_device
from kerneljudge.worker.process import CandidateFault

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("problem", "recording"), [("sliding_window_attention", True), ("causal_gqa", False)]
)
def test_policy_workers_start_on_the_gpu_ready_to_record(
    tmp_path: Path, problem: str, recording: bool
) -> None:
    probe = tmp_path / "probe.py"  # its import reports what the worker had loaded
    probe.write_text(
        "import sys, torch\n"
        "raise RuntimeError(f\"dynamo: {'torch._dynamo' in sys.modules} "
        'cuda: {torch.cuda.is_initialized()}")\n'
    )
    with Judge(problem, JudgeConfig(device="cuda", cache_dir=tmp_path)) as judge:
        worker = judge._pool(resolve_device("cuda", True)).take()
        try:
            with pytest.raises(CandidateFault, match=f"dynamo: {recording} cuda: True"):
                worker.request("load_candidate", 30.0, path=str(probe))
        finally:
            worker.close()
