"""Worker processes: where candidate code (and, separately, the reference) runs.

The supervisor side is :mod:`kerneljudge.worker.process`; the process itself is
:mod:`kerneljudge.worker.runtime`; builds run in :mod:`kerneljudge.worker.build`.
"""

from kerneljudge.worker.process import (
    CandidateFault,
    WorkerDied,
    WorkerPool,
    WorkerProcess,
    WorkerTimeout,
)

__all__ = ["CandidateFault", "WorkerDied", "WorkerPool", "WorkerProcess", "WorkerTimeout"]
