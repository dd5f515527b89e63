"""The executor's handle on one slot process (:mod:`kerneljudge.executors.slot`): start it,
exchange JSON lines with it, and end it."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kerneljudge.worker import confine
from kerneljudge.worker.host_tmp import SLOT, HostTmp

__all__ = ["SlotDied", "SlotProcess"]

_SRC_DIR = str(Path(__file__).resolve().parents[2])
#: Seconds :meth:`SlotProcess.close` waits for the slot's process group to end.
GROUP_WAIT_S = 10.0


class SlotDied(Exception):
    """The slot process ended (or stopped answering) while the executor waited on it."""


class SlotProcess:
    """One running slot process.

    Args:
        device: ``"cpu"`` or ``"cuda:N"``.
        cores: the CPU cores it (and every process it starts) may run on.
        max_judges: warm judges it keeps.
        log_path: where its stdout and stderr go (appended).

    Started with the executor's interpreter, in its own session, from the long-lived spawner
    thread of :func:`kerneljudge.worker.confine.spawn` with ``PR_SET_PDEATHSIG`` (SIGKILL) set
    before ``exec``, so it dies with the executor process however that dies. A CPU slot sees
    no GPU (``CUDA_VISIBLE_DEVICES`` empty).

    Its temporary folder (``TMPDIR``, where its judges make theirs) is a
    :class:`~kerneljudge.worker.host_tmp.HostTmp` of its own (``kerneljudge-slot-*``), made
    here after a sweep of the dead hosts' folders; this process and the slot hold its lock
    (the slot inherits the descriptor), and :meth:`close` removes it.

    Raises:
        OSError: the folder or the process could not be made (nothing is left).
    """

    def __init__(self, device: str, cores: tuple[int, ...], max_judges: int, log_path: Path):
        self.device = device
        to_slot_r, self._to_slot_w = os.pipe()
        self._from_slot_r, from_slot_w = os.pipe()
        try:
            self.tmp = HostTmp.make(SLOT)
        except BaseException:
            for fd in (to_slot_r, self._to_slot_w, self._from_slot_r, from_slot_w):
                os.close(fd)
            raise
        env = dict(os.environ)
        env["TMPDIR"] = str(self.tmp.path)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SRC_DIR, env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        if not device.startswith("cuda"):
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = [
            sys.executable,
            "-m",
            "kerneljudge.executors.slot",
            "--device",
            device,
            "--read-fd",
            str(to_slot_r),
            "--write-fd",
            str(from_slot_w),
            "--parent",
            str(os.getpid()),
            "--cores",
            ",".join(map(str, cores)),
            "--max-judges",
            str(max_judges),
            "--tmp-lock-fd",
            str(self.tmp.lock_fd),
        ]
        try:
            with open(log_path, "ab") as log:
                self.proc = confine.spawn(
                    cmd,
                    cpus=set(cores) or None,
                    pass_fds=(to_slot_r, from_slot_w, self.tmp.lock_fd),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                    die_with_parent=True,
                )
        except BaseException:
            for fd in (self._to_slot_w, self._from_slot_r):
                os.close(fd)
            self.tmp.remove()
            raise
        finally:
            os.close(to_slot_r)
            os.close(from_slot_w)
        self._buf = b""
        self.pid = self.proc.pid
        self.hello: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """Its ``ready`` message (``arch``, ``cores``, ``pid``).

        Raises:
            SlotDied: it ended or said nothing else within ``timeout_s``.
        """
        msg = self.recv(timeout_s)
        if msg.get("op") != "ready":
            self.kill()
            raise SlotDied(f"unexpected first message from the slot: {str(msg)[:200]}")
        self.hello = msg
        return msg

    def send(self, message: dict[str, Any]) -> None:
        """Write one message.

        Raises:
            SlotDied: it is gone.
        """
        data = memoryview((json.dumps(message) + "\n").encode())
        try:
            while data:
                data = data[os.write(self._to_slot_w, data) :]
        except OSError as exc:
            raise SlotDied(self.how_it_ended()) from exc

    def recv(self, timeout_s: float | None) -> dict[str, Any]:
        """The next message.

        Raises:
            SlotDied: it ended (end of file), or nothing came within ``timeout_s`` (then it is
                killed).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._from_slot_r], [], [], wait)
            if not ready:
                self.kill()
                raise SlotDied(f"no answer within {timeout_s:.0f} s (killed)")
            chunk = os.read(self._from_slot_r, 1 << 16)
            if not chunk:
                raise SlotDied(self.how_it_ended())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError as exc:
            self.kill()
            raise SlotDied("the slot sent a malformed message (killed)") from exc
        if not isinstance(msg, dict):
            self.kill()
            raise SlotDied("the slot sent a malformed message (killed)")
        return msg

    def alive(self) -> bool:
        return self.proc.poll() is None

    def how_it_ended(self) -> str:
        """A few words on how the process ended (waits up to 5 s for its exit status)."""
        try:
            code = self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"the judging process was killed by {signal.Signals(-code).name}"
        return f"the judging process exited with status {code}"

    def kill(self) -> None:
        """SIGKILL its process group (its judge's workers die by their parent-death signal)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10.0)

    def close(self, grace_s: float = 10.0) -> None:
        """Close its command pipe (an idle slot closes its judges and exits), wait up to
        ``grace_s`` seconds, then kill it; release the pipes; once its process group is gone
        (up to :data:`GROUP_WAIT_S` seconds), remove its temporary folder. Its workers run in
        sessions of their own and die by their parent-death signal, not with the group: what
        one still writes there as it dies is outlasted by the removal's retries
        (:meth:`HostTmp.remove`). Idempotent. Only the
        thread that talks to the slot calls it (another thread may :meth:`kill`)."""
        if self._to_slot_w >= 0:
            os.close(self._to_slot_w)
            self._to_slot_w = -1
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
        if self._from_slot_r >= 0:
            os.close(self._from_slot_r)
            self._from_slot_r = -1
        deadline = time.monotonic() + GROUP_WAIT_S
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        self.tmp.remove()
