"""Stopping a run of episodes at once on a stop signal (SIGINT, SIGTERM, SIGHUP).

While a run (:func:`kerneljudge.agent.runs.run_episodes`) waits for its episodes in the main
thread, :class:`~kerneljudge.stopping.StopSignals` turns each stop signal into a
:class:`KeyboardInterrupt` there. The run then does not wait for the episodes in flight:
:class:`Flight`, which knows them (their transcript writers and steps), ends their transcripts
with an ``interrupted`` record (renamed ``<episode id>.interrupted.jsonl``) and records them
``interrupted`` in ``state.jsonl``, as a resumed run would; from then on whatever those
episodes' threads still do is not recorded (:class:`Cancelled` stops them at their next event).
The run closes its judges, ends the workers still working in its temporary folder, removes it,
and raises :class:`RunInterrupted`; ``--resume`` runs the interrupted and the planned episodes
later.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from kerneljudge.agent.runlog import RunLog
from kerneljudge.agent.transcript import TranscriptWriter

__all__ = ["Cancelled", "Flight", "RunInterrupted"]


class RunInterrupted(KeyboardInterrupt):
    """A run of episodes stopped by a signal, its episodes in flight marked ``interrupted`` and
    its temporary folder removed.

    Attributes:
        signum: the signal (``SIGINT``, ``SIGTERM`` or ``SIGHUP``).
        out: the run's folder (None until the run sets it).
        exit_status: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
    """

    def __init__(self, signum: int, out: Path | None = None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.out = out

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class Cancelled(Exception):
    """Raised in an episode's thread at its next event once its run was interrupted."""


class Flight:
    """The episodes of a run in flight, and whether the run was interrupted.

    An episode's thread calls :meth:`record` for every event it logs and :meth:`end` for its
    summary; both raise :class:`Cancelled` instead once :meth:`interrupt` ran, so that nothing
    of an interrupted episode reaches the run's record after it was marked.

    Args:
        log: the run's record.
    """

    def __init__(self, log: RunLog) -> None:
        self.log = log
        self.cancelled = False
        self._lock = threading.Lock()
        self._writers: dict[str, TranscriptWriter] = {}
        self._steps: dict[str, int] = {}

    def record(
        self, slot: str, event: str, fields: dict[str, Any], writer: TranscriptWriter | None
    ) -> None:
        """Log ``event`` of ``slot``; a ``started`` one makes ``writer`` the slot's transcript
        (removed instead, with :class:`Cancelled`, once the run was interrupted).

        Raises:
            Cancelled: the run was interrupted.
        """
        with self._lock:
            if self.cancelled:
                if event == "started" and writer is not None:
                    writer.discard()
                raise Cancelled(slot)
            self.log.event(slot, event, **fields)
            if event == "started" and writer is not None:
                self._writers[slot] = writer
                self._steps[slot] = 0
            elif event == "step":
                self._steps[slot] = int(fields.get("steps", 0))

    def end(self, slot: str, summary: dict[str, Any], state: str) -> None:
        """Log the slot's summary line.

        Raises:
            Cancelled: the run was interrupted (nothing is logged).
        """
        with self._lock:
            if self.cancelled:
                raise Cancelled(slot)
            self.log.add_summary(slot, summary, state)
            self._writers.pop(slot, None)

    def say(self, line: str, progress: Any) -> None:
        """Pass a progress line on, unless the run was interrupted."""
        if progress is not None and not self.cancelled:
            progress(line)

    def interrupt(self, reason: str) -> list[str]:
        """Stop recording the episodes' threads and mark the episodes in flight
        ``interrupted``: their transcripts end with an ``interrupted`` record and are renamed
        ``<episode id>.interrupted.jsonl``. An episode whose transcript was complete but whose
        summary line was not written yet is left ``started``: a resumed run recovers it.

        Returns:
            The slots marked.
        """
        with self._lock:
            self.cancelled = True
            writers, steps = dict(self._writers), dict(self._steps)
            self._writers.clear()
        marked = []
        for slot, writer in writers.items():
            moved = writer.interrupt(steps.get(slot, 0), reason)
            if moved is None:
                continue
            transcript = self.log.relative(moved)
            self.log.event(slot, "interrupted", transcript=transcript, steps=steps.get(slot, 0))
            marked.append(slot)
        return marked
