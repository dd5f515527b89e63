"""Seconds the supervisor spends on each worker request, for the benchmarks that break a
verdict's time down by request (a request's time includes sending its tensors and receiving the
reply; the worker's compute is inside)."""

from __future__ import annotations

import time
from typing import Any

from kerneljudge.worker import WorkerProcess


def count_requests(
    timeline: list[tuple[float, float, str, str]] | None = None,
) -> dict[tuple[str, str], list[float]]:
    """Wrap :meth:`WorkerProcess.request` in this process so that every request's seconds are
    appended under ``(worker role, request name)`` in the returned dict (clear it to start
    afresh); with ``timeline``, also ``(start, end, role, request)`` of each (``perf_counter``
    seconds) to that list, and of each worker's close (request ``"(close)"``)."""
    spent: dict[tuple[str, str], list[float]] = {}
    plain = WorkerProcess.request

    def counted(self: Any, op: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return plain(self, op, *args, **kwargs)
        finally:
            t1 = time.perf_counter()
            spent.setdefault((self.role, op), []).append(t1 - t0)
            if timeline is not None:
                timeline.append((t0, t1, self.role, op))

    WorkerProcess.request = counted  # type: ignore[method-assign]
    if timeline is not None:
        plain_close = WorkerProcess.close

        def closed(self: Any) -> None:
            t0 = time.perf_counter()
            try:
                plain_close(self)
            finally:
                timeline.append((t0, time.perf_counter(), self.role, "(close)"))

        WorkerProcess.close = closed  # type: ignore[method-assign]
    return spent
