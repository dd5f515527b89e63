"""Stopping on a signal: SIGINT (Ctrl-C), SIGTERM (``kill PID``, ``timeout``, a scheduler's stop)
and SIGHUP (the terminal closed) raise a :class:`KeyboardInterrupt` in the main thread, so that
every clean-up on the way out runs (workers ended, temporary folders removed, a run recorded
as interrupted), and a stop is never lost.

:class:`StopSignals` is the one handler of the three: the console script
(:func:`kerneljudge.cli.app.main`) holds one around every command, a suite run
(:func:`kerneljudge.suite.runner.run_pairs`) one around its pairs, a run of episodes
(:func:`kerneljudge.agent.runs.run_episodes`) one around its episodes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from kerneljudge.errors import Terminated

__all__ = ["STOP_SIGNALS", "StopSignals", "exit_status", "interrupt_for", "signal_of"]

#: The signals that stop a command.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The blocks open in the main thread, outermost first: a signal that an inner block takes is
#: recorded in the outer ones too.
_open: list[StopSignals] = []


def interrupt_for(signum: int) -> KeyboardInterrupt:
    """The exception that signal ``signum`` raises: a plain :class:`KeyboardInterrupt` for SIGINT
    (as Python's own handler raises), :class:`~kerneljudge.errors.Terminated` for another."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def signal_of(exc: BaseException) -> int:
    """The signal ``exc`` stands for: a :class:`~kerneljudge.errors.Terminated`'s ``signum``,
    SIGINT for anything else (Ctrl-C's :class:`KeyboardInterrupt`)."""
    return exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)


def exit_status(exc: BaseException) -> int:
    """A command's exit status when ``exc`` stopped it: ``128 + signum`` (130 for Ctrl-C, 143
    for SIGTERM, 129 for SIGHUP)."""
    return 128 + signal_of(exc)


class StopSignals:
    """While the block runs in the main thread, each of ``signals`` that comes is recorded
    (:attr:`requested`, the first) and raises :func:`interrupt_for` it there. Python drops an
    exception raised while a finalizer (``__del__``, a weakref callback) runs, so the exception
    can vanish: :meth:`check` raises it again, and so does leaving the block without an
    exception. :meth:`hold` defers a stop over a clean-up that must run to its end. The handlers
    before the block are put back when it ends. Blocks nest: a signal that an inner block takes
    is recorded in every block open around it as well (its :attr:`requested`), though only the
    inner one raises. Outside the main thread (where no signal handler can be set) nothing is
    recorded.

    Args:
        signals: the signals taken.
        keep_ignored: those of ``signals`` left alone where they are ignored when the block
            begins (``nohup`` ignores SIGHUP; a shell's background job, SIGINT).
    """

    def __init__(
        self,
        signals: Iterable[int] = STOP_SIGNALS,
        *,
        keep_ignored: Iterable[int] = (signal.SIGHUP,),
    ) -> None:
        self.signals = tuple(signals)
        self.keep_ignored = frozenset(keep_ignored)
        #: The first stop signal that came in the block, or None.
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}
        self._holds = 0

    def _handle(self, signum: int, frame: Any) -> None:
        for block in {*_open, self}:
            if block.requested is None:
                block.requested = signum
        if not self._holds:
            raise interrupt_for(signum)

    def check(self) -> None:
        """Raise the stop if a signal came since the block began (and no :meth:`hold` lasts).

        Raises:
            KeyboardInterrupt: SIGINT came (:class:`~kerneljudge.errors.Terminated`: SIGTERM or
                SIGHUP came; the first signal decides).
        """
        if self.requested is not None and not self._holds:
            raise interrupt_for(self.requested)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Defer the stop while the inner block runs: a signal that comes meanwhile is recorded
        and raises nothing. Holds nest; when the outermost ends without an exception, a stop
        that came during it (none had come before it) is raised there. A stop that came before
        the hold is not raised again at its end: the code that holds is handling it.

        Raises:
            KeyboardInterrupt: as :meth:`check`, when the hold ends.
        """
        before = self.requested
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
        if before is None and not self._holds:
            self.check()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            _open.append(self)
            for signum in self.signals:
                if signum in self.keep_ignored and signal.getsignal(signum) is signal.SIG_IGN:
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        """Put the previous handlers back.

        Raises:
            KeyboardInterrupt: as :meth:`check`, when the block ends without an exception.
        """
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self in _open:
            _open.remove(self)
        if exc[0] is None:
            self.check()
