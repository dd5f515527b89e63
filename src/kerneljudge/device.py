"""The judging device: which one, and what it is."""

from __future__ import annotations

import os
import platform

import torch

from kerneljudge.build import toolchain
from kerneljudge.candidate.backends import REGISTRY
from kerneljudge.errors import DeviceError
from kerneljudge.verdict import DeviceInfo

__all__ = ["build_arch", "describe_device", "named_device", "resolve_device"]

#: The GPU backends' names as the messages write them (``cuda/triton``).
_GPU_NAMES = "/".join(b.name for b in REGISTRY if b.needs_gpu)


def resolve_device(requested: str, needs_gpu: bool) -> str:
    """The torch device string to judge on.

    Args:
        requested: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        needs_gpu: the candidate's backend runs on a CUDA device
            (:attr:`kerneljudge.candidate.backends.Backend.needs_gpu`: ``cuda``, ``triton``).

    ``auto`` is ``cuda:0`` for GPU backends and ``cpu`` for the others (``cpp``, ``torch``).

    Raises:
        DeviceError: a GPU is needed or requested but none is visible; a CPU was requested for
            a GPU backend; an unknown device string.
    """
    if requested == "auto":
        requested = "cuda" if needs_gpu else "cpu"
    if requested == "cpu":
        if needs_gpu:
            raise DeviceError("this candidate's backend runs on a CUDA GPU; use --device cuda")
        return "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(
                f"no CUDA GPU is visible on this machine: a {_GPU_NAMES} candidate can be built "
                "(kerneljudge build) but not run here"
            )
        index = int(requested.split(":")[1]) if ":" in requested else 0
        if index >= torch.cuda.device_count():
            raise DeviceError(
                f"no device {requested} (this machine has {torch.cuda.device_count()})"
            )
        return f"cuda:{index}"
    raise DeviceError(f"unknown device {requested!r} (use auto, cpu, cuda or cuda:N)")


def named_device(requested: str) -> str | None:
    """The device :func:`resolve_device` gives every candidate for ``requested`` when that does
    not depend on the candidate's backend (not ``auto``) and is visible here; else None."""
    if requested == "auto":
        return None
    try:
        return resolve_device(requested, needs_gpu=False)
    except DeviceError:
        return None


def describe_device(device: str) -> DeviceInfo:
    """Name, compute capability, SM count, memory and L2 size of ``device``."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return DeviceInfo(
            kind="cuda",
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_bytes=int(props.total_memory),
            l2_bytes=int(getattr(props, "L2_cache_size", 0)),
        )
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return DeviceInfo(kind="cpu", name=name, sm_count=os.cpu_count() or 0)


def build_arch(device: str | None) -> str:
    """The CUDA arch to build for: the judging GPU's own (``device``, else GPU 0 when one is
    visible), else :func:`kerneljudge.build.toolchain.target_arch`'s default."""
    cap = None
    if torch.cuda.is_available():
        dev = torch.device(device if device and device.startswith("cuda") else "cuda:0")
        major, minor = torch.cuda.get_device_capability(dev)
        cap = f"{major}.{minor}"
    return toolchain.target_arch(cap)
