"""Folders no confined process may be given the right to write, however its rules were named.

A confined process's writable folders are resolved when it is started
(:func:`kerneljudge.worker.confine.command`). A candidate may replace a folder it can write by a
link to one it may not (the reference's compile cache, where the reference worker loads what it
finds: :func:`kerneljudge.judge.reference_side.reference_environment`); the next process given
that folder would then be given the link's target. So every start drops the folders that
resolve to, above or beneath a protected one (:func:`outside_protected`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

__all__ = ["outside_protected", "protect"]

_PROTECTED: set[str] = set()
_LOCK = threading.Lock()


def protect(folder: str | os.PathLike[str]) -> None:
    """Protect ``folder`` (resolved now) in this process from now on."""
    with _LOCK:
        _PROTECTED.add(os.path.realpath(folder))


def outside_protected(resolved: Iterable[str]) -> list[str]:
    """The folders of ``resolved`` (resolved paths) that are neither a protected folder nor lie
    above or beneath one, in order."""
    with _LOCK:
        protected = tuple(_PROTECTED)

    def near(path: str, folder: str) -> bool:
        return os.path.commonpath([path, folder]) in (path, folder)

    return [p for p in resolved if not any(near(p, f) for f in protected)]
