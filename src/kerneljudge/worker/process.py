"""Supervisor side of the worker processes: spawn, talk, time out, kill, replace.

Each worker is a fresh interpreter (``python -m kerneljudge.worker``) in its own process group
and its own scratch directory, talking over a dedicated pipe pair; its stdout and stderr go to a
log file. A worker that crashes, hangs or poisons its CUDA context is killed with its whole
process group; nothing of it survives into the next job.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kerneljudge.errors import WorkerError
from kerneljudge.worker import confine, exits, kernel_cache
from kerneljudge.worker.environment import THREAD_BINDING, jit_cache_folders
from kerneljudge.worker.faults import (
    CandidateFault,
    WorkerDied,
    WorkerOverMemory,
    WorkerReplyTooLarge,
    WorkerTimeout,
)
from kerneljudge.worker.profiling import MEMORY_ENV, PROFILE_ENV, keep_profile, kept_folder
from kerneljudge.worker.protocol import (
    MAX_MESSAGE_BYTES,
    Channel,
    ChannelClosed,
    ChannelTimeout,
    MessageTooLarge,
)
from kerneljudge.worker.sandbox import candidate_environment, child_pids, pause_tree
from kerneljudge.worker.side import hand_over
from kerneljudge.worker.stamps import socket_pair

__all__ = ["CandidateFault", "WorkerDied", "WorkerProcess", "WorkerTimeout"]

_SRC_DIR = str(Path(__file__).resolve().parents[2])
#: Device files a candidate worker may open for writing besides ``confine.DEVICE_FILES``.
_GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")
#: Bytes of a worker's log kept for a verdict.
LOG_TAIL_BYTES = 4000


class WorkerProcess:
    """One worker process.

    Args:
        role: ``"reference"`` or ``"candidate"``.
        device: a torch device string (``"cpu"``, ``"cuda:0"``).
        env: extra environment variables.
        threads: torch intra-op threads (0: torch's default).
        memory_limit_bytes: resident memory (bytes) past which a waited-on worker is killed
            (0: no limit).
        record_ops: its ``run`` requests will record the operators a call runs; the recording
            machinery is loaded at start-up, before the worker reports ready.
        writable: folders besides its own a candidate worker may write beneath (Landlock; the
            build cache holding its ``TORCH_EXTENSIONS_DIR``).

    The worker runs confined (:mod:`kerneljudge.worker.confine`): in its own PID, network and
    mount namespaces where the host allows them, under Landlock, and killed with the supervisor.
    """

    def __init__(
        self,
        role: str,
        device: str,
        env: dict[str, str] | None = None,
        threads: int = 0,
        memory_limit_bytes: int = 0,
        record_ops: bool = False,
        writable: tuple[str, ...] = (),
    ) -> None:
        self.role = role
        self._candidate_ran = False
        self._reaped = False
        self.device = device
        self.memory_limit_bytes = memory_limit_bytes
        self.scratch = Path(tempfile.mkdtemp(prefix=f"kj-{role}-"))
        self.log_path = self.scratch / "worker.log"
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        # The timed calls' stamp socket (kerneljudge.worker.stamps): the worker's end is passed.
        self.stamps, stamp_end = socket_pair()
        # Descriptors handed to the worker (kerneljudge.worker.side): its end is passed.
        self._handoff, handoff_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        full_env = (
            candidate_environment(dict(os.environ))
            if role == "candidate"
            else {k: v for k, v in os.environ.items() if k not in THREAD_BINDING}
        )
        full_env.update(env or {})
        for name in (PROFILE_ENV, MEMORY_ENV):
            if os.environ.get(name):
                full_env[name] = "1"
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [_SRC_DIR, full_env.get("PYTHONPATH")])
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ beside cached candidates
        full_env["TMPDIR"] = str(self.scratch)
        if role == "reference":
            # Kernels compiled at run time (the digest's, the comparison's) are loaded only from
            # a kernel cache of this worker's own that this process filled, never from torch's
            # default one on disk, which a candidate may write to (kerneljudge.worker.
            # kernel_cache); where that cannot be, they are compiled anew.
            full_env.update(kernel_cache.environment(self.scratch, device))
        if not device.startswith("cuda"):
            full_env["CUDA_VISIBLE_DEVICES"] = ""
        args = [
            "kerneljudge.worker",
            "--role",
            role,
            "--device",
            device,
            "--read-fd",
            str(to_worker_r),
            "--write-fd",
            str(from_worker_w),
            "--stamp-fd",
            str(stamp_end.fileno()),
            "--handoff-fd",
            str(handoff_end.fileno()),
            "--threads",
            str(threads),
            *(["--record-ops"] if record_ops else []),
        ]
        cpus = None
        if device.startswith("cuda"):
            # Until it is pinned for timing, keep the worker (its start-up especially) off the
            # core where timed calls run.
            cpus = set(os.sched_getaffinity(0)) - {timing_cpu()} or None
        try:
            with open(self.log_path, "wb") as log:
                self.proc = confine.spawn(
                    confine.command(
                        args,
                        self._writable(full_env, writable),
                        _GPU_DEVICES,
                        # Not on a GPU yet: how the lock meets the CUDA driver's own threads
                        # has not been run there.
                        lock_scheduling=not device.startswith("cuda"),
                    ),
                    cpus=cpus,
                    pass_fds=(to_worker_r, from_worker_w, stamp_end.fileno(), handoff_end.fileno()),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=full_env,
                    cwd=self.scratch,
                )
        except BaseException:
            kernel_cache.release(self.scratch)
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self._start_ticks = start_ticks(self.proc.pid)
        os.close(to_worker_r)
        os.close(from_worker_w)
        stamp_end.close()
        handoff_end.close()
        self.chan = Channel(from_worker_r, to_worker_w)
        self.ready = False
        #: Whether the kernels it compiles at run time compiled or loaded at its start (its
        #: ``ready`` message; False off CUDA).
        self.kernels = False
        #: Longest reply the supervisor reads from this worker (bytes; 0: the protocol's own
        #: limit); a longer one is :class:`WorkerReplyTooLarge`.
        self.reply_limit_bytes = 0
        self._own_pid: int | None = None  # as the worker sees itself (its namespace's pid)
        self._host_pid: int | None = None
        self.id = uuid.uuid4().hex[:8]

    def _writable(self, env: dict[str, str], extra: tuple[str, ...]) -> list[str] | None:
        """Folders a candidate worker may write beneath (None: the trusted reference, no
        Landlock): its scratch folder, the Triton, inductor and CUDA JIT caches it uses, and
        ``extra`` (the build cache, where its ``TORCH_EXTENSIONS_DIR`` will be)."""
        if self.role != "candidate":
            return None
        return [str(self.scratch), *extra, *jit_cache_folders(env, self.device.startswith("cuda"))]

    # ------------------------------------------------------------------ life cycle
    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait for the worker's hello (torch imported, device context created).

        Raises:
            WorkerDied, WorkerTimeout: it did not come up.
        """
        if self.ready:
            return
        msg = self._recv("start", timeout_s)
        if msg.get("op") != "ready":
            self.kill()
            raise WorkerDied(None, "unexpected first message from worker")
        pid = msg.get("pid")
        self._own_pid = pid if type(pid) is int else None
        self.kernels = msg.get("kernels") is True
        if self.role == "reference" and self.kernels:  # before any request: no problem's code
            kernel_cache.keep_seed(self.scratch)  # has run there yet
        elif self.role == "reference":  # a seeded kernel that did not load (a file cut short?)
            kernel_cache.forget()
        self.ready = True

    def worker_pid(self) -> int:
        """The host pid of the Python worker process itself (the process the supervisor
        started is a launcher above it where the worker runs in its own PID namespace): the
        descendant whose innermost namespace pid (``NSpid`` in ``/proc/PID/status``) is the pid
        the worker reported when it came up. Falls back to the started process's pid."""
        if self._host_pid is None and self._own_pid is not None:
            for pid in [self.proc.pid, *child_pids(self.proc.pid)]:
                try:
                    with open(f"/proc/{pid}/status") as f:
                        line = next(ln for ln in f if ln.startswith("NSpid:"))
                except (OSError, StopIteration):
                    continue
                if int(line.split()[-1]) == self._own_pid:
                    self._host_pid = pid
                    break
        return self._host_pid or self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pause(self, paused: bool) -> None:
        """Stop (``SIGSTOP``) or continue (``SIGCONT``) the worker and all its descendants, so
        that nothing of it runs while another process is timed. A worker that has ended is
        left alone: once reaped, its pid may be another process's.

        ``unshare --fork --kill-child`` arms its child's parent-death signal after the fork:
        stopped before that, the child would outlive a supervisor killed meanwhile. So for a
        worker not yet ready (no candidate code ran in it) a stop waits for that child to run
        Python (:func:`~kerneljudge.worker.sandbox.wait_launched`), else leaves it running."""
        if self.proc.poll() is None:
            pause_tree(self.proc.pid, paused, launched=self.ready)

    def kill(self) -> None:
        """Kill the worker, every descendant it has (also those that left its process group;
        the worker is their subreaper, or the init of its PID namespace) and its process group,
        then reap it; in a PID namespace, only once every process of the namespace has ended.
        Once it is reaped, its pid may belong to another process: a second call does nothing."""
        if self._reaped:
            return
        # Once reaped (here or by a poll), the pid may be another process's: no descendants.
        descendants = child_pids(self.proc.pid) if self.proc.poll() is None else []
        for pid in descendants:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if descendants and confine.features().unshare:
            # The launcher exits once the namespace's init is gone, which is only after every
            # process of the namespace is: waiting for it makes the kill complete.
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped launcher cannot reap
                wait_exited(self.proc, 5)
                self._reaped = True
            except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
                pass
        if self.proc.returncode is not None and start_ticks(self.proc.pid) not in (
            None,
            self._start_ticks,
        ):
            self._reaped = True  # reaped before, and its pid (and group id) is another's now
        if not self._reaped:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                wait_exited(self.proc, 10)
                self._reaped = True
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass
        self.chan.close()
        self._handoff.close()

    def hand_over(self, fd: int, token: bytes) -> None:
        """Hand a copy of ``fd`` to the worker, labelled ``token``
        (:func:`kerneljudge.worker.side.hand_over`).

        Raises:
            OSError: the worker is gone, or the host refused the descriptor.
        """
        hand_over(self._handoff, fd, token)

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not, and delete its scratch directory."""
        if self.alive() and not self._reaped:
            try:
                self.chan.send({"op": "exit"})
                self.chan.recv(timeout_s=5)
            except (ChannelClosed, ChannelTimeout, OSError):
                pass
        self.kill()
        keep = kept_folder()
        if keep:
            keep_profile(self.scratch, Path(keep), f"{self.role}-{self.id}")
        kernel_cache.release(self.scratch)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                data = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return ("...\n" if size > limit else "") + data

    # ------------------------------------------------------------------ requests
    def rss_bytes(self) -> int:
        """Resident memory of the worker and its descendants (bytes, from ``/proc``)."""
        total = 0
        for pid in [self.proc.pid, *child_pids(self.proc.pid)]:
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
        return total

    def _recv(self, op: str, timeout_s: float, limit_s: float | None = None) -> dict[str, Any]:
        """The next reply, within ``timeout_s``; a timeout names ``limit_s``, the request's
        whole limit (sending it included), when given."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                self.chan.max_bytes = self.reply_limit_bytes or MAX_MESSAGE_BYTES
                return self.chan.recv(timeout_s=min(max(remaining, 0.0), 0.5))
            except MessageTooLarge as exc:
                self.kill()
                raise WorkerReplyTooLarge(exc.length, exc.limit, self.log_tail()) from None
            except ChannelTimeout:
                if self.memory_limit_bytes and self.rss_bytes() > self.memory_limit_bytes:
                    self.kill()
                    raise WorkerOverMemory(self.memory_limit_bytes, self.log_tail()) from None
                if remaining <= 0.5:
                    self.kill()
                    raise WorkerTimeout(op, limit_s or timeout_s) from None
            except (ChannelClosed, OSError):
                break
        try:
            wait_exited(self.proc, 5)
        except subprocess.TimeoutExpired:
            pass
        code = exits.exit_status(self.proc.poll())
        self.kill()
        raise WorkerDied(code, self.log_tail()) from None

    def request(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its answer.

        Raises:
            CandidateFault: the code under test raised; the worker is still alive.
            WorkerDied: the worker ended (crash, signal, ``os._exit``).
            WorkerTimeout: no answer within ``timeout_s``; the worker was killed.
            WorkerError: the worker reported a bug of its own (in a candidate worker, only until
                a ``load_candidate`` request was sent; afterwards it is a
                :class:`CandidateFault`).
        """
        self.wait_ready()
        started = time.monotonic()
        nonce = secrets.randbits(62)
        if op == "load_candidate":
            self._candidate_ran = True
        try:
            self.chan.send({"op": op, "nonce": nonce, **fields})
        except ChannelClosed:
            self._recv(op, 1.0)  # raises WorkerDied with the exit status
        # Sent: the request's tensors are not held here while the reply comes (the caller's
        # own references, if any, keep them).
        fields.clear()
        # The limit covers sending the request too: a timeout names the whole limit.
        reply = self._recv(op, max(0.1, timeout_s - (time.monotonic() - started)), timeout_s)
        if reply.get("nonce") != nonce:
            self.kill()
            raise WorkerDied(None, "a reply that does not answer the request (forged?)")
        if reply.get("ok"):
            return reply
        if reply.get("fault"):
            line = reply.get("lineno")
            raise CandidateFault(
                str(reply.get("error", "")),
                line if isinstance(line, int) else None,
                str(reply.get("status", "runtime_error")),
            )
        error = str(reply.get("error", ""))
        if self.role == "candidate" and self._candidate_ran:
            # Candidate code has run in this process: its state (memory, patched modules,
            # threads) is the candidate's doing, so a failure of the harness here is its fault.
            last = next((ln for ln in reversed(error.splitlines()) if ln.strip()), error)
            raise CandidateFault(
                f"the worker failed on {op} after loading the candidate: {last}\n{error}"
            )
        raise WorkerError(f"worker failed on {op}: {error}")


def start_ticks(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``), None when no
    process has that pid: a pid whose start differs from the one recorded names another
    process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def timing_cpu() -> int:
    """The CPU core timed GPU calls run on: the highest one this process may use.

    Host-side launch overhead is part of every timed GPU call, so the reference and the
    candidate are pinned to the same core, and nothing else of the judge's runs there.
    """
    return max(os.sched_getaffinity(0))


def wait_exited(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """``proc.wait(timeout_s)``, woken the moment the process ends (a pidfd, Linux 5.3+) rather
    than by :meth:`subprocess.Popen.wait`'s sleeps, which grow to 50 ms each: a worker's end
    costs what the end takes. Returns the exit status.

    Raises:
        subprocess.TimeoutExpired: still running after ``timeout_s`` seconds.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or reaped meanwhile
        return proc.wait(timeout=timeout_s)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(timeout_s, 0.0) * 1000):
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    finally:
        os.close(fd)
    return proc.wait(timeout=timeout_s)  # ended: reaps at once
