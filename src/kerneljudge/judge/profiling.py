"""A candidate's forward profiled in a judge's worker (:meth:`kerneljudge.judge.Judge.profile`)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from kerneljudge.check.limits import RunLimits, tensor_bytes
from kerneljudge.check.trials import set_up_candidate
from kerneljudge.device import resolve_device
from kerneljudge.judge.loading import load_candidate
from kerneljudge.judge.reference_side import derive_seed
from kerneljudge.problem import Problem

if TYPE_CHECKING:
    from kerneljudge.candidate import Candidate
    from kerneljudge.judge.pipeline import Judge

__all__ = ["profile_candidate"]


def profile_candidate(
    judge: Judge, cand: Candidate, *, calls: int = 5, seed: int | None = None
) -> list[dict[str, Any]]:
    """Profile the candidate's forward with torch.profiler, on the timed shape set's inputs.

    The candidate is built by ``judge`` (a cache hit after its ``evaluate``), loaded in a fresh
    worker of its pool with the reference's weights, run once, then ``calls`` times under the
    profiler. On CUDA the rows are GPU kernels and copies; on the CPU, operators by self time,
    the forward's own Python and extension code being ``ModelNew.forward``.

    Returns:
        Rows ``{"name", "device_time_ms", "calls", "share"}``, largest first: time per
        forward call (ms), runs per forward call, fraction of the profiled time. Empty when
        the candidate does not build or import.

    Raises:
        CandidateFault, WorkerDied, WorkerTimeout: the candidate failed while profiled.
        WorkerError: the profiler or the reference worker failed (``ReferenceFailed``).
        ProblemError: the problem's ``Model`` raised in the reference worker.
        DeviceError: the candidate needs a GPU and none is visible.
    """
    # Drawn below in this process: the problem probed as for a CPU judge (once per process).
    Problem.load(judge.problem.path)
    device = resolve_device(judge.config.device, cand.needs_gpu)
    result = judge.build(cand, device)
    if not result.ok:
        return []
    shape_set = judge.config.ordered_shape_sets()[-1]
    judge.reference.settle()
    ref = judge.reference.session(device, shape_set)
    run_seed = seed if seed is not None else secrets.randbits(62)
    worker = judge._pool(device).take()
    try:
        inputs = ref.problem.make_inputs(derive_seed(run_seed, shape_set, "profile"))
        moved = tensor_bytes([inputs, ref.init_inputs]) + ref.weight_bytes  # none measured
        timeout = RunLimits(judge.config.run_timeout_s).reference_s(moved)
        arch = judge.arch_for(device)
        if load_candidate(judge.cache, worker, cand, result, arch, timeout) is not None:
            return []
        set_up_candidate(worker, ref, timeout, timeout)
        worker.request("run", timeout, inputs=inputs)
        return list(worker.request("profile", timeout, calls=calls)["rows"])
    finally:
        worker.close()
