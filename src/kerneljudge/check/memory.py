"""The judging process's own memory: what relaying one trial costs it, and the check that it
can, made before the candidate's first trial.

The supervisor holds no trial's data beyond the one it relays (the reference worker keeps the
rest; :mod:`kerneljudge.check.reference`). Relaying a message of ``b`` bytes costs it at most
:data:`RELAY_FACTOR` ``x b``: a message is held once while its serialised copy is written, and
its buffer is held while its tensors are made from it (:mod:`kerneljudge.worker.protocol`). The
largest messages are a trial's inputs (to the candidate) and outputs (from the candidate, then
to the reference), and the outputs of one audited timed call, of the same size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kerneljudge.check.reference import HeldTrial
from kerneljudge.errors import ProblemError

__all__ = ["RELAY_FACTOR", "available_bytes", "check_budget", "relay_bytes", "reply_limit"]

#: Bytes the supervisor holds at once per byte of the largest message it relays.
RELAY_FACTOR = 2


def relay_bytes(trials: Sequence[HeldTrial]) -> int:
    """Peak bytes above its base the supervisor needs to relay the trials ``trials``:
    :data:`RELAY_FACTOR` x the largest of their inputs and (reference) outputs."""
    largest = max((max(t.input_bytes, t.output_bytes) for t in trials), default=0)
    return RELAY_FACTOR * largest


def available_bytes() -> int | None:
    """Memory this process can still get (bytes): the host's ``MemAvailable``
    (``/proc/meminfo``), bounded by the room left under its cgroup's ``memory.max`` (cgroup
    v2) where one is set; None where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        rel = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
        group = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit != "max":
            used = int((group / "memory.current").read_text())
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def check_budget(trials: Sequence[HeldTrial], budget_bytes: int, problem: str) -> int:
    """Check that relaying ``trials`` fits in ``budget_bytes`` (0: :func:`available_bytes`,
    no check where that is unknown).

    Returns the budget checked against (bytes; 0 where unknown): the judge reads no candidate
    reply longer than :func:`reply_limit` of it.

    Raises:
        ProblemError: it does not; the message gives the trial's sizes and the budget (MiB).
    """
    need = relay_bytes(trials)
    budget = budget_bytes or available_bytes() or 0
    if not budget or need <= budget:
        return budget
    largest = max(trials, key=lambda t: max(t.input_bytes, t.output_bytes))
    mib = 1 << 20
    raise ProblemError(
        f"{problem}: a trial's inputs ({largest.input_bytes / mib:.0f} MiB) and outputs "
        f"({largest.output_bytes / mib:.0f} MiB) need {need / mib:.0f} MiB in the judging "
        f"process, more than its memory budget of {budget / mib:.0f} MiB"
        f"{'' if budget_bytes else ' (the memory available on this host)'}"
    )


def reply_limit(budget_bytes: int) -> int:
    """Longest candidate reply (bytes) the judge reads within a budget of ``budget_bytes``
    (0: no limit but the protocol's): the largest message it can relay, plus 1 MiB for the
    reply's own fields."""
    return budget_bytes // RELAY_FACTOR + (1 << 20) if budget_bytes else 0
