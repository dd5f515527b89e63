"""Waiting for a confined command to end, and reading its worker's own exit status
(supervisor side; :mod:`kerneljudge.worker.confine` starts the commands)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

from kerneljudge.worker.confine import features

__all__ = ["exit_status", "exited"]


def exited(
    proc: subprocess.Popen[bytes], timeout_s: float, poll: Callable[[], None] | None = None
) -> bool:
    """Wait up to ``timeout_s`` seconds for ``proc`` to exit, without reaping it: while it is
    a zombie its pid, and so its process group id, cannot name another process. ``poll`` is
    called while it waits (every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if poll is not None:
            poll()
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.02, max(deadline - time.monotonic(), 0.0)))


def exit_status(returncode: int | None) -> int | None:
    """The worker's own exit status from that of its confined command: negative N when signal
    N killed it (the namespace's PID 1 reports it as 128 + N)."""
    if returncode is not None and features().unshare and 128 < returncode < 128 + 65:
        return 128 - returncode
    return returncode
