"""Honest candidates are judged, not refused: ``ModelNew`` defined by anything Python runs at
import, and ``torch.compile`` inside the sandbox."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.candidate import Candidate
from kerneljudge.worker.sandbox import INDUCTOR_IN_PROCESS, candidate_environment, library_probe

FIXTURES = Path(__file__).parent / "fixtures"

_BODY = (
    "    def __init__(self, features):\n"
    "        super().__init__()\n"
    "        self.lin = nn.Linear(features, features)\n"
    "    def forward(self, x):\n"
    "        y = torch.addmm(self.lin.bias, x, self.lin.weight.t())\n"
    "        return y.clamp_min(0).sum(-1, keepdim=True) * x\n"
)
_HEAD = "import torch\nimport torch.nn as nn\n"

#: Ways Python defines ModelNew at import that no module-level ``class`` statement shows.
DYNAMIC = {
    "if_else": _HEAD
    + "if torch.cuda.is_available():\n    ModelNew = None\nelse:\n"
    + "    class ModelNew(nn.Module):\n"
    + "\n".join("    " + ln for ln in _BODY.splitlines())
    + "\n",
    "try": _HEAD
    + "try:\n    import no_such_module_here\nexcept ImportError:\n"
    + "    class ModelNew(nn.Module):\n"
    + "\n".join("    " + ln for ln in _BODY.splitlines())
    + "\n",
    "factory": _HEAD
    + "def make():\n    class Net(nn.Module):\n"
    + "\n".join("    " + ln for ln in _BODY.splitlines())
    + "\n    return Net\nModelNew = make()\n",
    "loop": _HEAD
    + "class _Net(nn.Module):\n"
    + _BODY
    + "for _name in ['ModelNew']:\n    globals()[_name] = _Net\n",
    "helper_module": _HEAD
    + "import os, sys\n"
    + "_src = '''import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
    + _BODY
    + "'''\n"
    + "_dir = os.environ['TMPDIR']\n"
    + "with open(os.path.join(_dir, 'kj_helper_mod.py'), 'w') as f:\n    f.write(_src)\n"
    + "sys.path.insert(0, _dir)\nfrom kj_helper_mod import ModelNew\n",
}


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory):
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path_factory.mktemp("cache"),
        run_timeout_s=60.0,
        timing=False,
        threads=1,
        trials=2,
    )
    with Judge(FIXTURES / "tiny_problem.py", config) as j:
        yield j


@pytest.mark.parametrize("how", sorted(DYNAMIC))
def test_modelnew_defined_at_import_by_any_construct_is_judged(judge: Judge, how: str) -> None:
    cand = Candidate.from_source(DYNAMIC[how], name=f"{how}.py")
    assert cand.static_issues() == []
    v = judge.evaluate(cand)
    assert v.status is Status.CORRECT, v.reason


def test_a_module_without_modelnew_is_a_compile_error_from_its_import(judge: Judge) -> None:
    src = _HEAD + "if False:\n    class ModelNew(nn.Module):\n        pass\n"
    v = judge.evaluate(Candidate.from_source(src))
    assert v.status is Status.COMPILE_ERROR
    assert "does not define ModelNew" in v.reason


def test_candidate_environment_keeps_inductor_in_process() -> None:
    env = candidate_environment({"TORCHINDUCTOR_COMPILE_THREADS": "8", "PATH": "/usr/bin"})
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    for key, value in INDUCTOR_IN_PROCESS.items():
        assert env[key] == value


def test_only_inductors_library_probe_is_an_allowed_python_child() -> None:
    from torch._inductor.cpu_vec_isa import VecISA

    script = VecISA._avx_py_load.replace("__lib_path__", "/tmp/x/probe.so")
    assert library_probe([sys.executable, "-c", script])
    for bad in (
        "import os\nos.system('id')",
        "from ctypes import cdll\ncdll.LoadLibrary(__import__('os').environ['X'])",
        "import sys\nsys.modules['os'].system('id')",
        "from ctypes import CDLL\nCDLL('libc.so.6')",
        "from ctypes import cdll\ncdll.LoadLibrary('/x.so').system(b'id')",
        "import torch as os\n",
    ):
        assert not library_probe([sys.executable, "-c", bad]), bad
    assert not library_probe(["/bin/sh", "-c", script])
    assert not library_probe([sys.executable, script])


@pytest.mark.slow
def test_a_torch_compile_candidate_is_correct_on_the_cpu(tmp_path: Path) -> None:
    # CPU inductor writes and compiles C++ with g++ in the first call: tens of seconds, minutes
    # on a loaded host, so the call's limit is generous.
    config = JudgeConfig(
        device="cpu", cache_dir=tmp_path, run_timeout_s=600.0, timing=False, threads=1, trials=2
    )
    with Judge(FIXTURES / "tiny_problem.py", config) as judge:
        v = judge.evaluate(FIXTURES / "candidates" / "compiled.py")
    assert v.status is Status.CORRECT, v.reason
