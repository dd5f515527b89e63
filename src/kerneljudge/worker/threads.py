"""Python threads that outlive a call of candidate code (the sandbox's check after each call).

A thread the candidate leaves running could do work outside the timed window; the worker reports
it (:func:`lingering_threads`) and the judge rejects the candidate. tqdm's own monitor thread,
which ``torch.compile``'s autotuning starts and which lives as long as the process, is left out.
"""

from __future__ import annotations

import sys
import threading
import time

__all__ = ["lingering_threads", "thread_idents"]


def _library_monitors() -> tuple[type, type, object] | None:
    """tqdm's monitor thread class, tqdm's own class and the monitor's ``run`` function, as
    this module found them when it was imported (before any candidate code ran), or None
    without tqdm."""
    try:
        from tqdm._monitor import TMonitor
        from tqdm.std import tqdm
    except Exception:  # noqa: BLE001 - any failure of an optional library means "none"
        return None
    return TMonitor, tqdm, TMonitor.run


_MONITORS = _library_monitors()


def _library_threads() -> set[int]:
    """Idents of the one monitor thread that tqdm starts for its own progress bars
    (torch.compile's autotuning makes one during a call, and it lives as long as the process):
    a thread of tqdm's class, with tqdm's own ``run``, watching tqdm's bars."""
    if _MONITORS is None:
        return set()
    monitor, bar, run = _MONITORS
    return {
        t.ident
        for t in threading.enumerate()
        if type(t) is monitor
        and monitor.run is run
        and "run" not in vars(t)
        and getattr(t, "tqdm_cls", None) is bar
        and t.ident is not None
    }


def thread_idents() -> set[int]:
    """Idents of every Python thread: those of :mod:`threading` and those started with
    ``_thread.start_new_thread``, which never register there (``sys._current_frames`` lists
    every thread running Python code); less tqdm's monitor (:func:`_library_threads`)."""
    idents = {t.ident for t in threading.enumerate() if t.ident is not None} | set(
        sys._current_frames()
    )
    return idents - _library_threads()


def lingering_threads(before: set[int], grace_s: float = 0.2) -> list[str]:
    """Names of Python threads started since ``before`` (see :func:`thread_idents`) that are
    still alive after a grace period of ``grace_s`` seconds."""
    before = before | _library_threads()
    alive = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    deadline = time.monotonic() + grace_s
    for t in alive:
        t.join(timeout=grace_s / max(1, len(alive)))
    known = {t.ident for t in threading.enumerate()}

    def raw() -> list[int]:
        return [i for i in sys._current_frames() if i not in before and i not in known]

    hidden = raw()
    while hidden and time.monotonic() < deadline:
        time.sleep(0.01)
        hidden = raw()
    return [t.name for t in alive if t.is_alive()] + [
        f"thread {i}, started outside the threading module" for i in hidden
    ]
