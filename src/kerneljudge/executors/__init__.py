"""Executors: where verdicts run.

:mod:`~kerneljudge.executors.base` is the interface (:class:`Job`, :class:`Executor`,
:class:`JobError`). Implementations: the local executor (this machine's GPUs and CPU cores, a
CPU build pool) and the Ray executor (a cluster; ``pip install 'kerneljudge[ray]'``).
"""

from kerneljudge.executors.base import Executor, ExecutorStats, Job, JobError, new_job_id
from kerneljudge.executors.local import LocalExecutor

__all__ = ["Executor", "ExecutorStats", "Job", "JobError", "LocalExecutor", "new_job_id"]
