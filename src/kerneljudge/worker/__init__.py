"""Worker processes: where candidate code (and, separately, the reference) runs.

Supervisor side: :mod:`~kerneljudge.worker.process` (spawn, request, kill),
:mod:`~kerneljudge.worker.pool` (workers started ahead), :mod:`~kerneljudge.worker.spares`
(interpreters started ahead of any problem),
:mod:`~kerneljudge.worker.protocol` (the pipe's framing), :mod:`~kerneljudge.worker.replies`
(replies decoded into frozen types), :mod:`~kerneljudge.worker.faults` (how a request fails),
:mod:`~kerneljudge.worker.confine` (operating-system confinement),
:mod:`~kerneljudge.worker.environment` (the environment candidate code inherits).

The process itself: :mod:`~kerneljudge.worker.runtime` (the request handlers),
:mod:`~kerneljudge.worker.calls` (one confined call and what it left behind),
:mod:`~kerneljudge.worker.kept_trials` (the reference's kept trials and comparisons),
:mod:`~kerneljudge.worker.forward` (the float64 oracle, the operator recorder and the input
classifier, shared with the linter), :mod:`~kerneljudge.worker.measure` (the timed loop),
:mod:`~kerneljudge.worker.stamps` (kernel-stamped marks), :mod:`~kerneljudge.worker.sandbox` and
:mod:`~kerneljudge.worker.threads` (the audit hook, lingering threads),
:mod:`~kerneljudge.worker.warming` (a CUDA worker's start). Builds run in
:mod:`~kerneljudge.worker.build`.
"""

from kerneljudge.worker.pool import WorkerPool
from kerneljudge.worker.process import (
    CandidateFault,
    WorkerDied,
    WorkerProcess,
    WorkerTimeout,
)

__all__ = ["CandidateFault", "WorkerDied", "WorkerPool", "WorkerProcess", "WorkerTimeout"]
