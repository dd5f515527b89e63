"""Harness errors: what is wrong with the judge's inputs or set-up (never with a candidate).

A candidate's own failures (compile errors, wrong output, crashes, timeouts) are data in a
:class:`~kerneljudge.verdict.Verdict`; these exceptions are for everything else and each carries a
one-line message fit for a terminal.
"""

from __future__ import annotations

__all__ = [
    "KernelJudgeError",
    "ConfigError",
    "ProblemError",
    "CandidateError",
    "DeviceError",
    "WorkerError",
    "Terminated",
    "first_line",
    "not_a_file",
]


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def not_a_file(kind: str, path: object) -> str:
    """The one-line message for a ``kind`` file (``candidate``, ``problem``) at ``path`` that is
    not a regular file: missing (``... file not found: PATH``), a folder, or something else
    (a device such as ``/dev/null``, a pipe)."""
    from pathlib import Path

    p = Path(str(path))
    if p.is_dir():
        return f"{kind} file {path} is a folder, not a file"
    if p.exists():
        return f"{kind} file {path} is not a regular file"
    return f"{kind} file not found: {path}"


class KernelJudgeError(Exception):
    """Base class of every error kerneljudge raises on purpose."""


class ConfigError(KernelJudgeError, ValueError):
    """A configuration field holds a value out of its range; the one-line message names it.

    Attributes:
        field: the field's name (``trials``, ``baselines``, ...), as written in the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def for_option(self, option: str | None = None) -> str:
        """The message with the field's name replaced by a command-line option's
        (``run_timeout_s must be ...`` -> ``--run-timeout must be ...``). None: the option
        named after the field, its unit suffix (``_s``, ``_mib``) dropped, ``_`` as ``-``."""
        if option is None:
            name = self.field.removesuffix("_s").removesuffix("_mib")
            option = "--" + name.replace("_", "-")
        return str(self).replace(self.field, option, 1)


class ProblemError(KernelJudgeError):
    """A problem file or name is unusable (missing, unknown, does not import, lacks ``Model``)."""


class CandidateError(KernelJudgeError):
    """A candidate file cannot be read at all (missing file, not text).

    Everything that is wrong *inside* a readable candidate is a verdict instead.
    """


class DeviceError(KernelJudgeError):
    """The requested device is not there (e.g. a ``cuda`` candidate on a machine without a GPU)."""


class WorkerError(KernelJudgeError):
    """A trusted worker (the reference process) failed: a harness bug, never a candidate's fault."""


class BuildCacheError(KernelJudgeError, OSError):
    """The build cache could not be written where a build or its result goes: the folder cannot
    be made or written (not a folder, read-only, full), or an entry's folder still led elsewhere
    after the judge had made it a real one (something put a link back meanwhile)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill PID``) or SIGHUP (the terminal closed) in the main thread, raised by
    :class:`~kerneljudge.stopping.StopSignals`: a :class:`KeyboardInterrupt`, so that a
    command stops exactly as on Ctrl-C (its workers ended, its temporary folders removed; a
    suite run marked ``interrupted``, resumable). The command line exits ``128 + signum`` on
    it (143 on SIGTERM, 129 on SIGHUP; 130 on Ctrl-C).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int = 15) -> None:
        super().__init__()
        self.signum = int(signum)
