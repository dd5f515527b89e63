"""Interpreters started ahead of any problem, for a judge host's next new judge.

Before its first verdict a new :class:`~kerneljudge.judge.Judge` needs a probe child
(:mod:`kerneljudge.problem.probe`), a reference worker and its candidate pool's workers: each a
fresh interpreter that imports torch and, for a worker on a GPU, creates its CUDA context. That
took 2.9-7.9 s of a first verdict on the H200 machine
(docs/benchmarks/2026-12-04-h200-kernelbench-22-and-level3.md). A host that judges problem
after problem (an executor's slot, the Ray executor's judging actor) keeps them started here
while it waits, and a new judge adopts them.

A spare has run nothing of any problem or candidate when it is taken, and it is taken once:
each is used by one judge, as a process started for that judge would be, so nothing of one
problem or candidate reaches another. Taking never waits for a spare to be ready: the caller
waits as it would for a process it started itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Protocol, TypeVar

__all__ = ["Spare", "Spares", "stopped"]


class Spare(Protocol):
    """What :class:`Spares` keeps: a started process it can check, stop and end."""

    def alive(self) -> bool: ...

    def pause(self, paused: bool) -> None: ...

    def wait_ready(self, timeout_s: float = 120.0) -> None: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=Spare)


@contextlib.contextmanager
def stopped(processes: list[Spare]) -> Iterator[None]:
    """Inside the block ``processes`` are stopped (``pause(True)``); all of them continue at
    its end, also after an interrupt among the stops."""
    try:
        for each in processes:
            each.pause(True)
        yield
    finally:
        for each in processes:
            each.pause(False)


class Spares:
    """Spare processes by kind (a key naming how they were started), refilled between jobs.

    :meth:`take` hands out the oldest live spare of a kind, or starts one at once when there is
    none, and from then on wants ``count`` of that kind; :meth:`refill` starts the missing ones
    (the host calls it when a job has ended, so that no start competes with a verdict that is
    running). Not thread-safe: one thread takes and refills.
    """

    def __init__(self) -> None:
        self._start: dict[Hashable, Callable[[], Spare]] = {}
        self._count: dict[Hashable, int] = {}
        self._idle: dict[Hashable, list[Spare]] = {}
        self.closed = False

    def take(self, key: Hashable, start: Callable[[], S], count: int = 1) -> S:
        """A spare of kind ``key`` (its oldest live one), else ``start()`` now.

        Args:
            key: how ``start`` starts a process (equal keys: interchangeable processes).
            start: starts one such process.
            count: spares of this kind :meth:`refill` keeps from now on (at least 1).
        """
        if not self.closed:
            self._start[key] = start
            self._count[key] = max(1, count)
        idle = self._idle.get(key, [])
        while idle:
            spare = idle.pop(0)
            if spare.alive():
                spare.pause(False)  # taken inside a :meth:`paused` block, it must run
                return spare  # type: ignore[return-value]  # started by this key's ``start``
            spare.close()
        return start()

    def refill(self) -> None:
        """Start every spare that is missing (a dead one is replaced); nothing once closed."""
        if self.closed:
            return
        for key, start in self._start.items():
            idle = self._idle.setdefault(key, [])
            for spare in [s for s in idle if not s.alive()]:
                idle.remove(spare)
                spare.close()
            while len(idle) < self._count[key]:
                idle.append(start())

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until every spare has started (torch imported, a worker's device context
        created), at most ``timeout_s`` in all.

        Raises:
            WorkerDied, WorkerTimeout: a spare did not come up.
        """
        deadline = time.monotonic() + timeout_s
        for spare in self.kept():
            spare.wait_ready(max(0.0, deadline - time.monotonic()))

    def kept(self) -> list[Spare]:
        """The spares kept now, by kind in the order their kinds were first taken."""
        return [s for idle in self._idle.values() for s in idle]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside the block every spare is stopped (``SIGSTOP``), as a judge's own pool is while
        it times a candidate: a starting interpreter imports torch on every core it may use."""
        with stopped(self.kept()):
            yield

    def close(self) -> None:
        """End every spare; later takes start their process, and nothing is refilled."""
        self.closed = True
        self._start.clear()
        idle, self._idle = self.kept(), {}
        with contextlib.ExitStack() as ending:  # every one ended, even if one raises
            for spare in idle:
                ending.callback(spare.close)
                ending.callback(spare.pause, False)  # a stopped worker cannot take its exit
