"""A slot: one long-lived process that judges one job at a time on one device.

The local executor (:mod:`kerneljudge.executors.local`) starts one slot per GPU and a number of
CPU slots, each as ``python -m kerneljudge.executors.slot``. A slot hosts warm
:class:`~kerneljudge.judge.Judge` objects, one per (problem, build cache), at most
``--max-judges`` of them, least recently used closed first
(:class:`~kerneljudge.executors._warm.WarmJudges`, shared with the Ray executor's actors). A
fault that kills a slot (a segfault, SIGKILL, OOM) ends only that slot; the executor starts a
fresh one.

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

Its temporary folder (``TMPDIR``: its judges' workers' scratch folders and every other
temporary folder its judges make) is its own ``kerneljudge-slot-*`` folder
(:class:`~kerneljudge.worker.host_tmp.HostTmp`), made by the executor, which removes it when the
slot ends. The slot holds the folder's lock for its life (``--tmp-lock-fd``, a descriptor it
inherits and passes to no child), so a slot that outlives its executor for a moment has its
folder left alone until it ends, and removed by the next executor's or slot's sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["main"]


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
    """The judging side of a slot process (runs in the slot process; see the module doc): a
    :class:`~kerneljudge.executors._warm.WarmJudges` and the slot's wire format.

    Args:
        device: ``"cpu"`` or ``"cuda:N"``: every job's judge runs with this device.
        max_judges: warm judges kept (LRU).
    """

    def __init__(self, device: str, max_judges: int) -> None:
        from kerneljudge.executors._warm import WarmJudges

        self.device = device
        self.judges = WarmJudges(device, max_judges)

    def arch(self) -> str:
        return self.judges.arch()

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        """Judge one ``judge`` message; the reply message (a verdict or an error)."""
        import dataclasses

        from kerneljudge.verdict import BuildResult, decode

        raw = message.get("job") or {}
        job_id = str(raw.get("job_id", "")) if isinstance(raw, dict) else ""
        built = decode(BuildResult, message["build"]) if message.get("build") else None
        outcome = self.judges.run(
            raw,
            lambda job: dataclasses.replace(job.options.judge_config(), device=self.device),
            built=built,
        )
        if outcome.verdict is None:
            return {
                "op": "error",
                "job_id": job_id,
                "kind": outcome.kind,
                "message": outcome.message,
            }
        return {"op": "verdict", "job_id": job_id, "verdict": outcome.verdict.to_dict()}

    def close(self) -> None:
        self.judges.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerneljudge.executors.slot")
    parser.add_argument("--device", required=True)
    parser.add_argument("--read-fd", type=int, required=True)
    parser.add_argument("--write-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True, help="the executor's pid")
    parser.add_argument("--cores", default="", help="CPU cores of this slot, comma-separated")
    parser.add_argument("--max-judges", type=int, default=4)
    parser.add_argument("--tmp-lock-fd", type=int, default=-1, help="held for the slot's life")
    args = parser.parse_args(argv)
    if args.tmp_lock_fd >= 0:  # held open until this process ends; no child inherits it
        os.set_inheritable(args.tmp_lock_fd, False)
    if os.environ.get("TMPDIR"):
        tempfile.tempdir = os.environ["TMPDIR"]
    if args.cores:  # before torch starts any thread: every thread and child inherits it
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    from kerneljudge.worker.confine import _die_with

    # (Also armed before exec; again, in case it was not. Exits if the executor died first.)
    _die_with(args.parent)()
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
                slot.judges.refill()  # the next new problem's processes, once answered
            busy.clear()
    except (BrokenPipeError, OSError):
        return 0
    finally:
        slot.close()


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
