"""The durable record of a run of episodes: its plan, every episode's state, its summaries.

A run's output folder holds:

``run.json``
    the plan, written (atomically) before the first episode starts: ``problems``,
    ``episodes`` (per problem), ``slots`` (``slot``, ``problem``, ``index``: one per episode
    of the run), ``env_config``, ``runner`` (without the API key), ``concurrency``,
    ``created_at``.
``state.jsonl``
    one event a line, appended and flushed to disk (``fsync``) before the runner goes on:
    ``planned`` (every slot, at the start), ``started`` (``episode_id``, ``transcript``),
    ``step`` (``steps``: tool calls so far), ``finished``, ``failed`` (``reason``),
    ``interrupted`` (a resumed run found the slot started but unfinished, or a signal stopped
    the run while the episode ran: ``transcript``, its old transcript's new name, ``steps``),
    ``recovered`` (its summary was in its transcript only);
    and each runner process's own ``run`` (``pid``, ``tmp``: its temporary folder, ``todo``,
    ``concurrency``)
    and ``run_end``. Every event has ``at`` (UTC, ISO 8601); transcript paths are relative to
    the run folder. Slot ids are ``<run id>/<number>``: a later run in the same folder (once
    every episode of the earlier one has ended) has slots of its own.
``summary.jsonl``
    one line per episode that ended: :class:`~kerneljudge.agent.transcript.EpisodeSummary`'s
    fields plus ``slot`` and ``state`` (``finished`` or ``failed``), flushed to disk the same
    way. A slot with a line here is done and never run again.

A ``kill -9`` at any moment leaves at most one torn last line in a file; readers skip it and
the next writer cuts it off before appending. A slot's state is its last event: a slot last
``started`` or ``step`` with no summary line was running when the run died (``partial``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["RunLog", "SlotState", "cleanup_tmp", "read_jsonl", "repair_tail"]

PLAN = "run.json"
STATE = "state.jsonl"
SUMMARY = "summary.jsonl"
LOCK = ".run.lock"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def repair_tail(path: Path) -> None:
    """Cut a torn last line (one without its newline, left by a kill) off ``path``."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; a line that is not one (torn by a kill) is skipped."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                record = json.loads(raw.decode("utf-8", errors="replace"))
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    data = "".join(json.dumps(r, default=str) + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class SlotState:
    """Where one planned episode stands.

    Attributes:
        slot: the slot's id in the plan.
        problem: the problem as given.
        state: ``planned``, ``started``, ``partial`` (steps recorded, not ended),
            ``finished``, ``failed``.
        steps: tool calls recorded so far.
        episode_id: the episode's id once started ("" before).
        transcript: its transcript's path ("" before).
        reason: why it failed ("" otherwise).
        summary: its line of ``summary.jsonl`` (None while it has none).
    """

    slot: str
    problem: str
    state: str
    steps: int = 0
    episode_id: str = ""
    transcript: str = ""
    reason: str = ""
    summary: dict[str, Any] | None = None


class RunLog:
    """Reads and appends a run folder's ``run.json``, ``state.jsonl`` and ``summary.jsonl``.

    Args:
        out: the run's output folder.
        create: create the folder (a new run); False: it must exist to be read.
    """

    def __init__(self, out: Path | str, create: bool = True) -> None:
        self.out = Path(out)
        if create:
            self.out.mkdir(parents=True, exist_ok=True)
        self.plan_path = self.out / PLAN
        self.state_path = self.out / STATE
        self.summary_path = self.out / SUMMARY
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ ownership
    def lock(self) -> None:
        """Take the folder for this process (released when it exits, also by a kill).

        Raises:
            RuntimeError: another live process runs in this folder.
        """
        fd = os.open(self.out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"another run is going on in {self.out}") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ writing
    def write_plan(self, plan: dict[str, Any]) -> None:
        """Write ``run.json`` and a ``planned`` event per slot, both on disk before returning."""
        _write_atomic(self.plan_path, json.dumps({**plan, "created_at": _now()}, indent=1))
        self.event_many([{"slot": s["slot"], "event": "planned"} for s in plan["slots"]])

    def plan(self) -> dict[str, Any]:
        """The run's plan.

        Raises:
            FileNotFoundError: the folder holds no run.
        """
        if not self.plan_path.exists():
            raise FileNotFoundError(f"{self.out} holds no run to resume (no {PLAN})")
        plan = json.loads(self.plan_path.read_text(encoding="utf-8"))
        if not isinstance(plan, dict) or not isinstance(plan.get("slots"), list):
            raise ValueError(f"{self.plan_path}: not a run plan")
        return plan

    def event(self, slot: str, event: str, **fields: Any) -> None:
        """Append one event (on disk before returning)."""
        self.event_many([{"slot": slot, "event": event, **fields}])

    def event_many(self, records: list[dict[str, Any]]) -> None:
        _append(self.state_path, [{**r, "at": _now()} for r in records])

    def add_summary(self, slot: str, summary: dict[str, Any], state: str) -> None:
        """Append the slot's line to ``summary.jsonl``, then its ``finished``/``failed`` event."""
        _append(self.summary_path, [{**summary, "slot": slot, "state": state}])
        reason = str(summary.get("error") or "") if state == "failed" else ""
        extra = {"reason": reason} if state == "failed" else {}
        self.event(slot, state, episode_id=summary.get("episode_id", ""), **extra)

    def repair(self) -> None:
        """Cut torn last lines off the state and summary files (before appending to them)."""
        repair_tail(self.state_path)
        repair_tail(self.summary_path)

    def relative(self, path: Path | str) -> str:
        """``path`` relative to the run folder when it lies inside it (as events store it)."""
        try:
            return str(Path(path).resolve().relative_to(self.out.resolve()))
        except ValueError:
            return str(path)

    def resolve(self, path: str) -> str:
        """A path as events store it, made usable from here ("" stays "")."""
        return str(self.out / path) if path and not Path(path).is_absolute() else path

    # ------------------------------------------------------------------ reading
    def summaries(self) -> dict[str, dict[str, Any]]:
        """``summary.jsonl`` by slot (the first line of a slot wins)."""
        out: dict[str, dict[str, Any]] = {}
        for rec in read_jsonl(self.summary_path):
            slot = rec.get("slot")
            if isinstance(slot, str) and slot not in out:
                out[slot] = rec
        return out

    def states(self) -> list[SlotState]:
        """Every planned slot's state, in plan order."""
        plan = self.plan()
        done = self.summaries()
        last: dict[str, dict[str, Any]] = {}
        started: dict[str, dict[str, Any]] = {}
        steps: dict[str, int] = {}
        for rec in read_jsonl(self.state_path):
            slot = rec.get("slot")
            if not isinstance(slot, str):
                continue
            last[slot] = rec
            if rec.get("event") == "started":
                started[slot], steps[slot] = rec, 0
            elif rec.get("event") == "step":
                steps[slot] = int(rec.get("steps", 0))
            elif rec.get("event") == "interrupted":
                started.pop(slot, None)
                steps[slot] = 0
        out = []
        for entry in plan["slots"]:
            slot = entry["slot"]
            begun = started.get(slot, {})
            summary = done.get(slot)
            if summary is not None:
                state = str(summary.get("state", "finished"))
                reason = str(summary.get("error", "")) if state == "failed" else ""
            else:
                event = last.get(slot, {}).get("event", "planned")
                state = {"step": "partial", "started": "started"}.get(event, "planned")
                reason = ""
            out.append(
                SlotState(
                    slot=slot,
                    problem=str(entry["problem"]),
                    state=state,
                    steps=steps.get(slot, 0),
                    episode_id=str(begun.get("episode_id", "")),
                    transcript=self.resolve(str(begun.get("transcript", ""))),
                    reason=reason,
                    summary=summary,
                )
            )
        return out

    def run_records(self) -> list[dict[str, Any]]:
        """The ``run`` events of every runner process that worked in this folder."""
        return [r for r in read_jsonl(self.state_path) if r.get("event") == "run"]


@contextlib.contextmanager
def locked(log: RunLog) -> Iterator[RunLog]:
    """:meth:`RunLog.lock` for the duration of the block."""
    log.lock()
    try:
        yield log
    finally:
        log.unlock()


def cleanup_tmp(tmp: Path | str) -> None:
    """End the processes working in ``tmp`` (a dead run's workers; their working folder is
    there) and remove the folder. Only processes whose working folder is inside ``tmp`` are
    signalled, each by its id. A path that is not a run's own folder (``kj-run-*`` directly in
    the system's temporary folder: a run folder's record may have been edited) is left alone."""
    root = os.path.realpath(tmp)
    own = os.path.realpath(tempfile.gettempdir())
    name = os.path.basename(root)
    if os.path.dirname(root) != own or not name.startswith("kj-run-") or not os.path.isdir(root):
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
