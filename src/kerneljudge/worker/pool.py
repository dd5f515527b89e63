"""Candidate workers started ahead of need: :class:`WorkerPool`."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

from kerneljudge.worker.faults import WorkerDied, WorkerTimeout
from kerneljudge.worker.process import WorkerProcess
from kerneljudge.worker.spares import Spares, close_all, stopped

__all__ = ["WorkerPool", "default_memory_limit"]


def default_memory_limit() -> int:
    """Host memory a candidate worker may use: half of this machine's RAM (bytes)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 0


class WorkerPool:
    """Candidate workers started ahead of need, each used for exactly one candidate.

    :meth:`take` hands out a worker that has already imported torch and created its device
    context, and starts its replacement at once, so the next candidate does not wait for start-up.
    A replacement that starts while a candidate is judged competes with it for cores (and, on a
    GPU, for the driver); :meth:`paused` stops it meanwhile. With ``spares``, its workers are
    taken from there (:class:`~kerneljudge.worker.spares.Spares`, ``size`` of them kept).
    """

    def __init__(
        self,
        device: str,
        env: dict[str, str] | None = None,
        size: int = 1,
        threads: int = 0,
        memory_limit_bytes: int | None = None,
        record_ops: bool = False,
        writable: tuple[str, ...] = (),
        spares: Spares | None = None,
    ) -> None:
        self.device = device
        self.spares = spares
        self.record_ops = record_ops
        self.writable = tuple(writable)
        self.env = dict(env or {})
        self.size = size
        self.threads = threads
        self.memory_limit_bytes = (
            default_memory_limit() if memory_limit_bytes is None else memory_limit_bytes
        )
        self._idle: list[WorkerProcess] = []

    def _spawn(self) -> WorkerProcess:
        # The start and the spares' key are made of the same values, read once here: a field
        # changed later (``record_ops``) makes another kind, never a spare filed under this one.
        env, settings = dict(self.env), (self.threads, self.memory_limit_bytes)
        record_ops, writable = self.record_ops, self.writable
        start = functools.partial(
            WorkerProcess,
            "candidate",
            self.device,
            env,
            *settings,
            record_ops=record_ops,
            writable=writable,
        )
        if self.spares is None:
            return start()
        pairs = tuple(sorted(env.items()))
        key = ("candidate", self.device, pairs, *settings, record_ops, writable)
        return self.spares.take(key, start, self.size)

    def prestart(self) -> None:
        while len(self._idle) < self.size:
            self._idle.append(self._spawn())

    def take(self) -> WorkerProcess:
        """A ready candidate worker (the caller closes it when done). A worker that did not
        come up is closed and one more is started; whatever stops the wait (a second failure,
        Ctrl-C, SIGTERM) closes the worker taken, so that no scratch folder is left behind.

        Raises:
            WorkerDied, WorkerTimeout: the worker started in place of one that did not come up
                did not come up either.
        """
        self.prestart()
        worker = self._idle.pop(0)
        try:
            self.prestart()
            try:
                worker.wait_ready()
            except (WorkerDied, WorkerTimeout):
                worker.close()
                worker = self._spawn()
                worker.wait_ready()
        except BaseException:
            worker.close()
            raise
        return worker

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside the block the workers started ahead of need are stopped (``SIGSTOP``): a
        starting worker imports torch for seconds on every core it may use, and a candidate's
        trials and timing should have the machine to itself."""
        with stopped(list(self._idle)):
            yield

    def close(self) -> None:
        idle, self._idle = self._idle, []
        close_all(idle)
