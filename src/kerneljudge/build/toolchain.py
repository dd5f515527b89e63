"""The compiler toolchain: where CUDA lives, what versions build a candidate, which arch to target.

Nothing here runs at import time; the CUDA root and the tool versions are found on first use
and cached per process, the rest is read from the environment on every call.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "build_environment",
    "cuda_home",
    "cuda_pch_enabled",
    "fingerprint",
    "pch_enabled",
    "target_arch",
]

#: Bumped whenever the way kerneljudge builds a candidate changes, so old cache entries miss.
BUILD_PROTOCOL = "5"
#: The arch CUDA candidates are built for when no GPU is visible and none is configured
#: (Hopper, compute capability 9.0: the H100/H200 the task prompts name).
DEFAULT_ARCH = "9.0"
#: The compiler torch's builder is given when shared precompiled headers are on (``$CXX``):
#: a shell script that runs :mod:`kerneljudge.build.pch_cxx`.
PCH_WRAPPER = Path(__file__).resolve().with_name("cxx") / "c++"


def _has_nvcc(root: Path) -> bool:
    return (root / "bin" / "nvcc").is_file()


@functools.cache
def cuda_home() -> str | None:
    """The CUDA toolkit root, or None when there is no toolkit.

    Order: ``$CUDA_HOME`` / ``$CUDA_PATH`` when they hold ``bin/nvcc``; ``/usr/local/cuda``; the
    folder above the real (symlink-resolved) ``nvcc`` on ``PATH``. torch's own guess takes the
    folder above ``nvcc``'s *link*, which is ``/usr/local`` when ``/usr/local/bin/nvcc`` is a link,
    and linking then fails on ``-lcudart``.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and _has_nvcc(Path(value)):
            return value
    if _has_nvcc(Path("/usr/local/cuda")):
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    if nvcc:
        root = Path(nvcc).resolve().parent.parent
        if _has_nvcc(root):
            return str(root)
    return None


def _last_output_line(cmd: list[str]) -> str:
    """The last non-empty line of ``cmd``'s stdout, stripped; ``"unavailable"`` when it cannot
    run, runs past 30 s or prints nothing."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unavailable"


@functools.cache
def nvcc_version() -> str:
    """The last line of ``nvcc --version`` (its build string), or ``"unavailable"``."""
    home = cuda_home()
    return (
        _last_output_line([str(Path(home) / "bin" / "nvcc"), "--version"])
        if home
        else "unavailable"
    )


@functools.cache
def cxx_version() -> str:
    """The first line of ``c++ --version`` (the host compiler), or ``"unavailable"``."""
    try:
        out = subprocess.run(["c++", "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0].strip() if out.stdout else "unavailable"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unavailable"


def tool_path() -> str:
    """``PATH`` for the build and run workers: this interpreter's own ``bin`` folder first.

    torch's extension loader runs ``ninja`` from ``PATH``, in the build worker and again, to
    find nothing to do, in the run worker. Two ninjas (a virtual environment's and the
    system's) hash commands differently, so a build made by one looks stale to the other and
    would be rebuilt inside the run worker's time limit; both workers must find the same one.
    """
    here = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


@functools.cache
def ninja_version() -> str:
    """``"<ninja --version> (<path>)"`` of the ninja the workers find (see :func:`tool_path`),
    or ``"unavailable"``."""
    exe = shutil.which("ninja", path=tool_path())
    if exe is None:
        return "unavailable"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        return f"{out.stdout.strip()} ({exe})"
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"


def target_arch(capability: str | None) -> str:
    """The ``TORCH_CUDA_ARCH_LIST`` value to build with: only the judging device's own arch.

    ``capability`` is the device's ``"major.minor"`` (None without a GPU). ``$TORCH_CUDA_ARCH_LIST``
    wins when set; without a GPU the default is :data:`DEFAULT_ARCH`.
    """
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    return capability or DEFAULT_ARCH


def fingerprint(arch: str) -> dict[str, str]:
    """What, besides the source, decides a build's output: part of every cache key."""
    import torch

    return {
        "build_protocol": BUILD_PROTOCOL,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "nvcc": nvcc_version(),
        "cxx": cxx_version(),
        "ninja": ninja_version(),
        "arch": arch,
        "parallel_nvcc": str(parallel_nvcc_enabled()),
        "pch": str(pch_enabled()),
        "cuda_pch": str(cuda_pch_enabled()),
    }


def pch_enabled() -> bool:
    """Whether C++ compiles may use a shared precompiled ``torch/extension.h``
    (:mod:`kerneljudge.build.pch`): the default on Linux where Landlock confines the build
    workers (without it a build worker could write the shared store); ``KERNELJUDGE_PCH=0``
    turns it off."""
    if os.environ.get("KERNELJUDGE_PCH", "1") == "0" or sys.platform != "linux":
        return False
    from kerneljudge.worker import confine

    f = confine.features()
    return f.enabled and f.landlock_abi >= 1 and os.access(PCH_WRAPPER, os.X_OK)


def cuda_pch_enabled() -> bool:
    """Whether CUDA host compiles may share a precompiled prefix of torch's headers
    (:mod:`kerneljudge.build.pch_cuda`): with :func:`pch_enabled` and
    :func:`parallel_nvcc_enabled`, unless ``KERNELJUDGE_CUDA_PCH=0``."""
    return (
        os.environ.get("KERNELJUDGE_CUDA_PCH", "1") != "0"
        and parallel_nvcc_enabled()
        and pch_enabled()
    )


def parallel_nvcc_enabled() -> bool:
    """Whether CUDA sources compile through :mod:`kerneljudge.build.parallel_nvcc` (the default;
    ``KERNELJUDGE_PARALLEL_NVCC=0`` runs plain nvcc)."""
    return os.environ.get("KERNELJUDGE_PARALLEL_NVCC", "1") != "0"


def build_environment(
    arch: str, extensions_dir: Path, pch_store: Path | None = None
) -> dict[str, str]:
    """Environment variables shared by the build worker and the run worker of one candidate.

    Both must see the same values, or torch's extension loader would rebuild on load.
    ``pch_store``: the shared precompiled headers' folder (:func:`kerneljudge.build.pch.store_dir`;
    None or :func:`pch_enabled` false: C++ compiles run the plain compiler).
    """
    env = {
        "TORCH_EXTENSIONS_DIR": str(extensions_dir),
        "TORCH_CUDA_ARCH_LIST": arch,
        "MAX_JOBS": str(max(1, os.cpu_count() or 1)),
        "PATH": tool_path(),
    }
    home = cuda_home()
    if home:
        env["CUDA_HOME"] = home
        if parallel_nvcc_enabled():
            script = Path(__file__).with_name("parallel_nvcc.py")
            env["KERNELJUDGE_NVCC"] = str(Path(home) / "bin" / "nvcc")
            env["PYTORCH_NVCC"] = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    # A store path with a character that make-style dependency files escape stays out (its
    # paths could not be taken out of them, see kerneljudge.build.pch_cxx).
    if pch_store is not None and pch_enabled() and not set(str(pch_store)) & set(" \t\n#$:\\"):
        from kerneljudge.build import pch

        env.update(pch.environment(pch_store))
    return env
