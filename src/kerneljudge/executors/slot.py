"""A slot: one long-lived process that judges one job at a time on one device.

The local executor (:mod:`kerneljudge.executors.local`) starts one slot per GPU and a number of
CPU slots, each as ``python -m kerneljudge.executors.slot``. A slot hosts warm
:class:`~kerneljudge.judge.Judge` objects, one per (problem, build cache), at most
``--max-judges`` of them, least recently used closed first. A fault that kills a slot (a
segfault, SIGKILL, OOM) ends only that slot; the executor starts a fresh one.

Wire (two dedicated pipes, one JSON object per line; the slot's stdout and stderr go to a log):

* slot -> executor, once: ``{"op": "ready", "pid", "device", "arch", "cores"}``;
* executor -> slot: ``{"op": "judge", "job": Job.to_dict(), "build": BuildResult | null}``
  (``build``: the executor's build of a job whose build timed out, which the cache does not
  keep; any other build the slot's judge finds in the build cache);
* slot -> executor: ``{"op": "verdict", "job_id", "verdict": Verdict.to_dict()}`` or
  ``{"op": "error", "job_id", "kind", "message"}`` (a :class:`~kerneljudge.executors.JobError`).

The slot dies with the executor: ``PR_SET_PDEATHSIG`` (SIGKILL, set before ``exec``), a check
that its parent is still the executor, and end of file on its command pipe (the executor closed
or died), upon which an idle slot closes its judges and exits and a busy one exits at once (its
judge's workers die with it, by their own parent-death signal).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:500]


class _Lines:
    """JSON lines over a pipe pair."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = os.fdopen(read_fd, "rb", buffering=0)
        self.write_fd = write_fd
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.write_fd, view) :]


class Slot:
    """The judging side of a slot process (runs in the slot process; see the module doc).

    Args:
        device: ``"cpu"`` or ``"cuda:N"``: every job's judge runs with this device.
        max_judges: warm judges kept (LRU).
    """

    def __init__(self, device: str, max_judges: int) -> None:
        from kerneljudge.judge import Judge

        self.device = device
        self.max_judges = max(1, max_judges)
        self.judges: OrderedDict[tuple[str, str], Judge] = OrderedDict()
        #: Held while a job is judged; every warm judge's work ahead of need (its next
        #: verdict's reference side) waits for it, so none runs beside another's timing.
        self.device_lock = threading.Lock()

    def arch(self) -> str:
        from kerneljudge.device import build_arch

        return build_arch(self.device)

    def _judge_for(self, problem: str, cache_dir: str | None, config: Any) -> Any:
        from kerneljudge.judge import Judge

        key = (problem, cache_dir or "")
        judge = self.judges.pop(key, None)
        if judge is None:
            judge = Judge(problem, config)
            judge.device_lock = self.device_lock
        self.judges[key] = judge
        while len(self.judges) > self.max_judges:
            _, old = self.judges.popitem(last=False)
            _close_quietly(old)
        return judge

    def drop(self, problem: str, cache_dir: str | None) -> None:
        judge = self.judges.pop((problem, cache_dir or ""), None)
        if judge is not None:
            _close_quietly(judge)

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        """Judge one ``judge`` message; the reply message (a verdict or an error)."""
        import dataclasses

        from kerneljudge.candidate import Candidate
        from kerneljudge.errors import KernelJudgeError
        from kerneljudge.executors.base import Job, error_kind
        from kerneljudge.verdict import BuildResult, decode

        raw = message.get("job") or {}
        job_id = str(raw.get("job_id", ""))
        try:
            job = Job.from_dict(raw)
            config = dataclasses.replace(job.options.judge_config(), device=self.device)
        except (ValueError, KernelJudgeError) as exc:
            return {"op": "error", "job_id": job_id, "kind": "harness", "message": _one_line(exc)}
        built = decode(BuildResult, message["build"]) if message.get("build") else None
        try:
            cand = Candidate.from_source(job.source, name=job.name)
            judge = self._judge_for(job.problem, job.options.cache_dir, config)
            changes = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
            with (
                self.device_lock,
                judge.configured(**changes),
                _handed_build(judge, cand, built),
            ):
                verdict = judge.evaluate(cand)
        except KernelJudgeError as exc:
            kind = error_kind(exc)
            self.drop(job.problem, job.options.cache_dir)
            return {"op": "error", "job_id": job_id, "kind": kind, "message": _one_line(exc)}
        except Exception as exc:  # noqa: BLE001 - a harness bug is this job's error, not the slot's
            self.drop(job.problem, job.options.cache_dir)
            message_ = f"{type(exc).__name__}: {_one_line(exc)}"
            return {"op": "error", "job_id": job_id, "kind": "harness", "message": message_}
        return {"op": "verdict", "job_id": job_id, "verdict": verdict.to_dict()}

    def close(self) -> None:
        while self.judges:
            _, judge = self.judges.popitem()
            _close_quietly(judge)


class _handed_build:  # noqa: N801 - used as a context manager, like contextlib's helpers
    """Within the block, ``judge.build`` of ``cand`` returns ``built`` (a build the executor ran
    whose result the cache does not keep: a timed-out one) instead of building again."""

    def __init__(self, judge: Any, cand: Any, built: Any) -> None:
        self.judge, self.cand, self.built = judge, cand, built

    def __enter__(self) -> None:
        if self.built is None:
            return
        original, sha, built = type(self.judge).build, self.cand.sha256, self.built

        def build(cand: Any, device: str | None = None) -> Any:
            if cand.sha256 == sha:
                return built
            return original(self.judge, cand, device)

        self.judge.build = build

    def __exit__(self, *exc: object) -> None:
        self.judge.__dict__.pop("build", None)


def _close_quietly(judge: Any) -> None:
    try:
        judge.close()
    except Exception:  # noqa: BLE001 - closing a broken judge must not end the slot
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerneljudge.executors.slot")
    parser.add_argument("--device", required=True)
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True, help="the executor's pid")
    parser.add_argument("--cores", default="", help="CPU cores of this slot, comma-separated")
    parser.add_argument("--max-judges", type=int, default=4)
    args = parser.parse_args(argv)
    if args.cores:  # before torch starts any thread: every thread and child inherits it
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    from kerneljudge.worker.confine import _pdeathsig_preexec

    _pdeathsig_preexec()  # (also set before exec; again, in case it was not)
    if os.getppid() != args.parent:
        return 1  # the executor died before the signal was armed
    lines = _Lines(args.read_fd, args.write_fd)
    slot = Slot(args.device, args.max_judges)
    busy = threading.Event()
    inbox: list[dict[str, Any] | None] = []
    arrived = threading.Condition()

    def read() -> None:
        for raw in lines.reader:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with arrived:
                inbox.append(msg)
                arrived.notify()
        if busy.is_set():  # end of file while judging: the executor is gone or closing
            os._exit(0)
        with arrived:
            inbox.append(None)
            arrived.notify()

    threading.Thread(target=read, name="slot-reader", daemon=True).start()
    lines.send(
        {
            "op": "ready",
            "pid": os.getpid(),
            "device": args.device,
            "arch": slot.arch(),
            "cores": sorted(os.sched_getaffinity(0)),
        }
    )
    try:
        while True:
            with arrived:
                while not inbox:
                    arrived.wait()
                msg = inbox.pop(0)
                if msg is None:
                    return 0
                busy.set()
            if msg.get("op") == "judge":
                reply = slot.run(msg)
                busy.clear()
                lines.send(reply)
            busy.clear()
    except (BrokenPipeError, OSError):
        return 0
    finally:
        slot.close()


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
