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
waits as it would for a process it started itself. The spares a host refills when a job has ended
start during the next job's build and reference stages; a judge stops them from the load of its
candidate to the end of its verdict (:meth:`Spares.paused`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Protocol, TypeVar

from kerneljudge.errors import first_line

__all__ = ["Spare", "Spares", "close_all", "stopped"]

log = logging.getLogger(__name__)


class Spare(Protocol):
    """What :class:`Spares` keeps: a started process it can check, stop and end."""

    def alive(self) -> bool: ...

    def pause(self, paused: bool) -> None: ...

    def wait_ready(self, timeout_s: float = 120.0) -> None: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=Spare)


@contextlib.contextmanager
def stopped(processes: Sequence[Spare]) -> Iterator[None]:
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
    (the host calls it when a job has ended). Only the ``max_kinds`` kinds taken most recently
    are kept: taking another ends the spares of the least recently taken kind, so a host whose
    jobs come with ever new settings (build cache folders, thread counts) keeps a bounded
    number of processes. Not thread-safe: one thread takes and refills.

    Args:
        max_kinds: kinds kept (at least 1); a new CUDA judge takes 3 (its probe, its reference
            worker, its candidate workers), a problem that records operators a 4th.
    """

    def __init__(self, max_kinds: int = 4) -> None:
        self.max_kinds = max(1, max_kinds)
        self._start: OrderedDict[Hashable, Callable[[], Spare]] = OrderedDict()
        self._count: dict[Hashable, int] = {}
        self._idle: dict[Hashable, list[Spare]] = {}
        self.closed = False

    def take(
        self,
        key: Hashable,
        start: Callable[[], S],
        count: int = 1,
        now: Callable[[], S] | None = None,
    ) -> S:
        """A spare of kind ``key`` (its oldest live one), else ``now()`` (default ``start()``).

        Args:
            key: every argument ``start`` starts a process with (equal keys: interchangeable
                processes); the first ``start`` given for a key is the one :meth:`refill` uses.
            start: starts one such process, reading nothing that can change after this call.
            count: spares of this kind :meth:`refill` keeps from now on (at least 1).
            now: starts the process to hand out when no spare is kept (one that will be used at
                once needs nothing done while it would wait).
        """
        if not self.closed:
            self._start.setdefault(key, start)
            self._start.move_to_end(key)
            self._count[key] = max(1, count)
            while len(self._start) > self.max_kinds:
                self._forget(next(iter(self._start)))
        idle = self._idle.get(key, [])
        while idle:
            spare = idle.pop(0)
            if spare.alive():
                spare.pause(False)  # taken inside a :meth:`paused` block, it must run
                return spare  # type: ignore[return-value]  # started by this key's ``start``
            spare.close()
        return (now or start)()

    def refill(self) -> None:
        """Start every spare that is missing (a dead one is replaced); nothing once closed.
        A failure to start one is logged and ends the refill, the spares started before it
        kept: the next new judge then starts its own process. Never raises for a start."""
        if self.closed:
            return
        try:
            for key, start in self._start.items():
                idle = self._idle.setdefault(key, [])
                for spare in [s for s in idle if not s.alive()]:
                    idle.remove(spare)
                    spare.close()
                while len(idle) < self._count[key]:
                    idle.append(start())
        except Exception as exc:  # noqa: BLE001 - never the job's error, nor the host's
            text = f"{type(exc).__name__}: {first_line(str(exc))}"
            log.warning("starting spare processes failed: %s", text)

    def _forget(self, key: Hashable) -> None:
        """Stop keeping kind ``key``: its spares end."""
        del self._start[key]
        self._count.pop(key, None)
        close_all(self._idle.pop(key, []))

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until every spare has started (torch imported, a worker's device context
        created), at most ``timeout_s`` in all.

        Raises:
            WorkerDied, WorkerTimeout: a worker did not come up.
            ProblemError: a probe child did not (see
                :meth:`kerneljudge.problem.probe.ProbeChild.wait_ready`).
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
        close_all(idle)


def close_all(spares: Sequence[Spare]) -> None:
    """Close ``spares``, every one even if one raises; each continues first (a stopped worker
    cannot take its exit request)."""
    with contextlib.ExitStack() as ending:
        for spare in spares:
            ending.callback(spare.close)
            ending.callback(spare.pause, False)
