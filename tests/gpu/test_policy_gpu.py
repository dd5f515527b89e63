"""GPU tier: a policy problem's candidate worker comes up on the GPU already recording-ready
(its ``--record-ops`` start-up runs a CUDA op under the operator recorder)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("problem", "recording"), [("sliding_window_attention", True), ("rmsnorm", False)]
)
def test_policy_workers_start_on_the_gpu_ready_to_record(
    fresh_worker_report, problem: str, recording: bool
) -> None:
    assert fresh_worker_report(problem, "cuda") == f"dynamo: {recording} cuda: True"
