"""Seconds the supervisor spends on each worker request, for the benchmarks that break a
verdict's time down by request (a request's time includes sending its tensors and receiving the
reply; the worker's compute is inside)."""

from __future__ import annotations

import time
from typing import Any

from kerneljudge.worker import WorkerProcess


def count_requests() -> dict[tuple[str, str], list[float]]:
    """Wrap :meth:`WorkerProcess.request` in this process so that every request's seconds are
    appended under ``(worker role, request name)`` in the returned dict (clear it to start
    afresh)."""
    spent: dict[tuple[str, str], list[float]] = {}
    plain = WorkerProcess.request

    def counted(self: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return plain(self, op, *args, **kwargs)
        finally:
            spent.setdefault((self.role, op), []).append(time.perf_counter() - t0)

    WorkerProcess.request = counted  # type: ignore[method-assign]
    return spent
