"""What a CUDA worker does once at its start, before its first request, so that no request
pays for it: the device's context, the kernels this package compiles at run time, and the
libraries a model's first call would otherwise load.

On an H100, a fresh candidate worker's first correctness trial took 0.19 s for KernelBench's
level-3 VisionTransformer and 0.14 s for its level-1 3-D convolution, against 0.007 s and
0.013 s for the trials after it (``benchmarks/verdict_profile.py --timeline``). A first call
makes the cuBLAS and cuDNN handles and loads those libraries' and torch's kernels; how much of
that difference this warm-up removes was not measured apart from other changes
(docs/benchmarks/2026-12-06-h100-kernelbench-20-floor.md).
"""

from __future__ import annotations

import torch

from kerneljudge.worker import digest

__all__ = ["warm_device", "warm_libraries"]


def warm_device(device: torch.device, role: str) -> bool:
    """On a CUDA ``device``: the context and the fused digest's kernels
    (:func:`kerneljudge.worker.digest.warm`), in the reference worker (the one that compares)
    the comparison's fused kernels (:func:`kerneljudge.check.fused.warm`), and
    :func:`warm_libraries`. Nothing on another device. Returns whether every one of those
    kernels compiled (or loaded): False off CUDA."""
    if device.type != "cuda":
        return False
    compiled = digest.warm(device)
    if role == "reference":
        from kerneljudge.check import fused

        compiled = fused.warm(device) and compiled
    warm_libraries(device)
    return compiled


def warm_libraries(device: torch.device) -> bool:
    """Run a few common operators on tiny tensors of ``device`` (a linear layer with a bias and
    a matrix product: cuBLAS and cuBLASLt; 2-D and 3-D convolutions: cuDNN; layer norm,
    softmax, GELU and scaled dot-product attention), wait for them, then give the caching
    allocator's blocks back. Returns False where one of them raised (nothing is kept of it:
    the candidate's own call then meets the same library as it would have)."""
    try:
        with torch.no_grad():
            x = torch.ones(2, 4, 8, 8, device=device)
            torch.nn.functional.conv2d(x, torch.ones(4, 4, 3, 3, device=device))
            v = x.unsqueeze(2)
            torch.nn.functional.conv3d(v, torch.ones(4, 4, 1, 3, 3, device=device))
            rows = x.reshape(-1, 8)
            torch.nn.functional.linear(rows, rows[:8], rows[0])
            _ = rows @ rows[:8]
            torch.nn.functional.layer_norm(x, (8,))
            torch.softmax(x, -1)
            torch.nn.functional.gelu(x)
            torch.nn.functional.scaled_dot_product_attention(x, x, x)
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - a library that fails here fails the same way later
        return False
    finally:
        try:
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a context that fails: its first request says so
            pass
    return True
