"""nvcc with concurrent front ends: its plan, a real compile (symbols agree on both sides) and
a real compile error (reported once)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kerneljudge.build import parallel_nvcc, toolchain

SCRATCH = "/tmp/kj-nvcc-abc"
_T = SCRATCH + "/tmpxft_1"
# ``nvcc -dryrun``'s plan for one .cu file (abridged; nvcc pads some lines with spaces).
DRYRUN = "\n".join(
    "#$ " + line
    for line in [
        "_NVVM_BRANCH_=nvvm",
        "_SPACE_= ",
        "CICC_PATH=/usr/local/cuda/bin/../nvvm/bin",
        "PATH=/usr/local/cuda/bin/../nvvm/bin:/usr/local/cuda/bin:/usr/bin",
        'INCLUDES="-I/usr/local/cuda/bin/../targets/x86_64-linux/include"  ',
        f'gcc -std=c++17 -E -x c++ -D__CUDACC__ "k.cu" -o "{_T}-5_k.cpp4.ii" ',
        f'cudafe++ --c++17 --gen_c_file_name "{_T}-6_k.cudafe1.cpp" '
        '--stub_file_name "tmpxft_1-6_k.cudafe1.stub.c" --gen_module_id_file '
        f'--module_id_file_name "{_T}-4_k.module_id" "{_T}-5_k.cpp4.ii" ',
        f'gcc -std=c++17 -D__CUDA_ARCH__=900 -E -x c++ "k.cu" -o "{_T}-7_k.cpp1.ii" ',
        f'"$CICC_PATH/cicc" --c++17 -arch compute_90 --module_id_file_name '
        f'"{_T}-4_k.module_id" "{_T}-7_k.cpp1.ii" -o "{_T}-6_k.ptx"',
        f'ptxas -arch=sm_90 -m64 "{_T}-6_k.ptx" -o "{_T}-8_k.cubin" ',
        f'fatbinary -64 "--image3=kind=elf,sm=90,file={_T}-8_k.cubin" '
        f'--embedded-fatbin="{_T}-3_k.fatbin.c" ',
        f"rm {_T}-3_k.fatbin",
        f'gcc -std=c++17 -c -x c++ "{_T}-6_k.cudafe1.cpp" -o "k.o" ',
    ]
)


def test_plan_splits_host_and_device_front_ends() -> None:
    plan = parallel_nvcc.plan_of(DRYRUN, SCRATCH)
    assert plan is not None
    assert plan.env["CICC_PATH"] == "/usr/local/cuda/bin/../nvvm/bin"
    assert plan.env["INCLUDES"] == "-I/usr/local/cuda/bin/../targets/x86_64-linux/include"
    assert [c.split()[0] for c in plan.host] == ["gcc", "cudafe++"]
    assert "--gen_module_id_file" not in plan.host[1]  # both sides read the module id written
    assert [c.split()[0] for c in plan.device] == ["gcc", '"$CICC_PATH/cicc"', "ptxas", "fatbinary"]
    assert [c.split()[0] for c in plan.tail] == ["rm", "gcc"]
    assert plan.module_id_path == f"{_T}-4_k.module_id"


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("#$ cudafe++", "#$ -- Filter Dependencies -- > k.d\n#$ cudafe++"),
        lambda t: t.replace(f'-o "{_T}-5', '-o "/elsewhere/tmpxft_1-5'),
        lambda t: t.replace("--gen_module_id_file ", ""),
        lambda t: t.replace("#$ fatbinary", "#$ nvlink x\n#$ fatbinary"),
    ],
    ids=["internal-step", "temp-outside-scratch", "no-module-id", "device-link"],
)
def test_unfamiliar_plans_fall_back_to_plain_nvcc(change) -> None:  # type: ignore[no-untyped-def]
    assert parallel_nvcc.plan_of(change(DRYRUN), SCRATCH) is None


needs_nvcc = pytest.mark.skipif(toolchain.cuda_home() is None, reason="needs nvcc")

KERNEL = """
namespace {
__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }
}
void launch(float* x, float a) { scale<<<1, 32>>>(x, a); }
"""


def _compile(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "k.cu").write_text(source)
    env = toolchain.build_environment("9.0", tmp_path / "ext")
    return subprocess.run(
        [*env["PYTORCH_NVCC"].split(), "-MD", "-MF", "k.o.d"]
        + ["-gencode=arch=compute_90,code=sm_90", "-O3", "-c", "k.cu", "-o", "k.o"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
@needs_nvcc
def test_host_stub_and_device_code_name_the_same_kernel(tmp_path: Path) -> None:
    done = _compile(tmp_path, KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    deps = (tmp_path / "k.o.d").read_text()  # the headers too, as nvcc's own would list
    assert deps.startswith("k.o:") and " k.cu" in deps and "cuda_runtime.h" in deps
    text = (tmp_path / "k.o").read_bytes().decode("latin-1")
    # The anonymous namespace's name comes from the module id; the host stub and the cubin's
    # own sections must agree on it, or the launch finds no kernel.
    names = set(re.findall(r"_ZN\d+_GLOBAL__N__\w+?5scaleEPff", text))
    assert len(names) == 1, names
    assert f".text.{names.pop()}" in text


@pytest.mark.slow
@needs_nvcc
def test_a_compile_error_is_reported_once(tmp_path: Path) -> None:
    done = _compile(tmp_path, KERNEL.replace("*= a;", "*= undefined_name;"))
    assert done.returncode != 0
    log = done.stdout + done.stderr
    assert log.count('identifier "undefined_name" is undefined') == 1, log


def test_plain_nvcc_when_switched_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KERNELJUDGE_PARALLEL_NVCC", "0")
    env = toolchain.build_environment("9.0", tmp_path)
    assert "PYTORCH_NVCC" not in env
    assert toolchain.fingerprint("9.0")["parallel_nvcc"] == "False"


def test_only_torchs_dependency_request_is_taken_out() -> None:
    split = parallel_nvcc._split_depfile
    assert split(["-MD", "-MF", "a.d", "-c", "k.cu"]) == (["-c", "k.cu"], "a.d")
    assert split(["-Xcompiler", "-MD", "-c", "k.cu"]) == (["-Xcompiler", "-MD", "-c", "k.cu"], None)
