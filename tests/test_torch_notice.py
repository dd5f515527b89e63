"""torch's 'No CUDA runtime is found, using CUDA_HOME=...' notice, logged wherever its extension
loader is imported with no GPU visible, reaches no build log and no worker output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig
from kerneljudge.build import BuildCache, build
from kerneljudge.candidate import Candidate

FIX = Path(__file__).parent / "fixtures"
NOTICE = "No CUDA runtime is found"


@pytest.fixture(autouse=True)
def cuda_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CUDA toolkit is installed, torch's loader finds it and would log the notice."""
    from kerneljudge.build import toolchain

    home = toolchain.cuda_home()
    if home:
        monkeypatch.setenv("CUDA_HOME", home)


def test_the_build_worker_logs_no_notice(tmp_path: Path) -> None:
    src = (
        "import torch.nn as nn\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "if False:\n    load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    cand = Candidate.from_source(src)
    assert cand.backend == "cpp"
    result = build(cand, cache=BuildCache(tmp_path), arch="9.0")
    assert result.ok and NOTICE not in result.log


def test_a_candidate_worker_on_the_cpu_logs_no_notice(tmp_path: Path) -> None:
    cand = tmp_path / "raises.py"
    cand.write_text(
        "import sys\nimport torch.nn as nn\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "print('imported', file=sys.stderr)\n"
        "class ModelNew(nn.Module):\n"
        "    def __init__(self, features):\n        super().__init__()\n"
        "        self.lin = nn.Linear(features, features)\n"
        "    def forward(self, x):\n        raise RuntimeError('raised in forward')\n"
    )
    config = JudgeConfig(
        device="cpu", cache_dir=tmp_path, baselines=("eager",), timing_config=TimingConfig()
    )
    with Judge(FIX / "tiny_problem.py", config) as judge:
        v = judge.evaluate(cand)
    assert v.status is Status.RUNTIME_ERROR, v.reason
    assert "imported" in v.worker_log and "raised in forward" in v.worker_log
    assert NOTICE not in v.worker_log


def test_cached_logs_of_earlier_builds_leave_the_notice_out(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    cache.entry("k").mkdir(parents=True)
    log = f"W1201 torch/utils/cpp_extension.py:183] {NOTICE}, using CUDA_HOME='/cuda'\nok"
    stored = {"ok": True, "backend": "cpp", "log": log}
    (cache.entry("k") / "build.json").write_text(json.dumps(stored))  # the earlier format
    result = cache.load("k")
    assert result is not None and result.ok and result.log == "ok"
