"""GPU tier: a CUDA reference worker loads the kernels it compiles at run time (the fused digest
and comparison) from its own kernel cache, filled from this process's seed, instead of
compiling them again (kerneljudge.worker.kernel_cache)."""

from __future__ import annotations

import pytest

from kerneljudge.worker import kernel_cache
from kerneljudge.worker.process import WorkerProcess

pytestmark = pytest.mark.gpu


def test_the_next_reference_worker_loads_the_seeded_kernels_and_compiles_none() -> None:
    if not kernel_cache.usable("cuda:0"):
        pytest.skip("no Landlock of ABI 3 or later here: the reference's kernel cache is off")
    kernel_cache.forget()
    first = WorkerProcess("reference", "cuda:0")
    try:
        first.wait_ready()
        assert first.kernels  # compiled
        seeded = kernel_cache.seed()
    finally:
        first.close()
    assert len(seeded) >= 3, sorted(seeded)  # the digest's and the comparison's kernels
    second = WorkerProcess("reference", "cuda:0")
    try:
        second.wait_ready()
        assert second.kernels  # loaded: a seeded kernel that did not load would say False
        folder = second.scratch / kernel_cache.FOLDER
        # A kernel compiled anew would have been written beside the seeded files.
        assert sorted(p.name for p in folder.iterdir()) == sorted(seeded)
    finally:
        second.close()
