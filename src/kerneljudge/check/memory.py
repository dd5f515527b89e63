"""The judging process's own memory: what relaying one trial's inputs costs it, and the check
that it can, made before the candidate's first trial.

The supervisor holds no trial's data beyond the one it relays (the reference worker keeps the
rest; :mod:`kerneljudge.check.reference`). Relaying a message of ``b`` bytes costs it at most
:data:`RELAY_FACTOR` ``x b``: a message is held once while its serialised copy is written, and
its buffer is held while its tensors are made from it (:mod:`kerneljudge.worker.protocol`). The
largest messages it relays are a trial's inputs: on a CPU the first trial's, drawn here and sent
to the reference worker (checked here, before the trials), and any trial's where a candidate's
own draw differs from the reference's (checked when it happens: they are sent only when they fit
:func:`reply_limit`). A candidate's outputs (a trial's, an audited timed call's) do not cross the
supervisor: they go to the reference worker on a pipe of their own
(:mod:`kerneljudge.worker.side`).
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
    """Peak bytes above its base the supervisor needs to relay the inputs of the trials
    ``trials``: :data:`RELAY_FACTOR` x the largest of them."""
    return RELAY_FACTOR * max((t.input_bytes for t in trials), default=0)


def available_bytes() -> int | None:
    """Memory this process can still get (bytes): the host's ``MemAvailable``
    (``/proc/meminfo``), bounded by the room left under its cgroup's ``memory.max`` (cgroup
    v2) where one is set: the limit less ``memory.current``, plus the cgroup's
    ``inactive_file`` (page cache the kernel reclaims first, which ``memory.current`` counts);
    None where neither can be read."""
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
            stat = dict(ln.split() for ln in (group / "memory.stat").read_text().splitlines())
            used -= int(stat.get("inactive_file", 0))
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def check_budget(
    trials: Sequence[HeldTrial], budget_bytes: int, problem: str, inputs_sent: bool = True
) -> int:
    """Check that relaying the inputs of ``trials`` fits in ``budget_bytes`` (0:
    :func:`available_bytes`, no check where that is unknown), where the supervisor sends them
    (``inputs_sent``: on a CPU; on a GPU the workers draw them, and nothing is checked here).

    Returns the budget checked against (bytes; 0 where unknown): the judge reads no candidate
    reply longer than :func:`reply_limit` of it, and relays no inputs longer than that.

    Raises:
        ProblemError: it does not; the message gives the trial's sizes and the budget (MiB).
    """
    need = relay_bytes(trials) if inputs_sent else 0
    budget = budget_bytes or available_bytes() or 0
    if not budget or need <= budget:
        return budget
    largest = max(trials, key=lambda t: t.input_bytes)
    mib = 1 << 20
    raise ProblemError(
        f"{problem}: a trial's inputs ({largest.input_bytes / mib:.0f} MiB) need "
        f"{need / mib:.0f} MiB in the judging process, more than its memory budget of "
        f"{budget / mib:.0f} MiB{'' if budget_bytes else ' (the memory available on this host)'}"
    )


def reply_limit(budget_bytes: int) -> int:
    """Longest candidate reply (bytes) the judge reads within a budget of ``budget_bytes``
    (0: no limit but the protocol's): the largest message it can relay, plus 1 MiB for the
    reply's own fields."""
    return budget_bytes // RELAY_FACTOR + (1 << 20) if budget_bytes else 0
