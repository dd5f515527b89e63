"""A profile of a worker's request handlers, for finding where a verdict's time goes in the
workers (``benchmarks/verdict_profile.py --workers``); off unless :data:`PROFILE_ENV` is set."""

from __future__ import annotations

import contextlib
import cProfile
import os
import tempfile
from collections.abc import Iterator

__all__ = ["PROFILE_ENV", "PROFILE_FILE", "RequestProfiler"]

#: Environment variable naming a folder: when set, every worker profiles its request handlers
#: (cProfile) and the supervisor copies each worker's profile there when it closes the worker.
PROFILE_ENV = "KERNELJUDGE_WORKER_PROFILE"
#: The profile's file name in a worker's scratch folder.
PROFILE_FILE = "requests.prof"


class RequestProfiler:
    """A ``cProfile`` of a worker's request handlers when :data:`PROFILE_ENV` is set (else it
    does nothing), written to the worker's scratch folder (``TMPDIR``) as
    :data:`PROFILE_FILE` after every request; the supervisor keeps it when it closes the worker
    (``benchmarks/verdict_profile.py --workers``)."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile() if os.environ.get(PROFILE_ENV) else None

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        if self.profile is None:
            yield
            return
        self.profile.enable()
        try:
            yield
        finally:
            self.profile.disable()
            self.profile.dump_stats(os.path.join(tempfile.gettempdir(), PROFILE_FILE))
