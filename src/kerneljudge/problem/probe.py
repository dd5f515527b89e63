"""The problem probe: a problem file is untrusted input, so it is first run in a child process
under a time limit and a memory limit, before the judge imports it.

The child (``python -m kerneljudge.problem.probe RESULT MEMORY_BYTES cuda|cpu [--spare]``, the
third word saying whether the judge sees a CUDA device; :class:`ProbeChild`) imports torch,
reports :data:`WAITING`, reads the problem's path from its stdin (so that it can be started
before the problem is known: :mod:`kerneljudge.worker.spares`), then loads the problem, reads
its metadata (``DTYPE``,
``TOLERANCE``, ``POLICY``, ``SHAPE_SETS``) and, for every shape set, calls ``get_init_inputs``,
constructs ``Model``, calls ``get_inputs`` and makes the first reference call on the CPU, as the
judge's supervisor and reference worker will. Before each step it writes the step's name to
``RESULT``, then its outcome, so that a child that exits, is killed or hangs is reported with the
step it was in; once the outcome is written it ends at once (``os._exit``: an interpreter's
shutdown with torch imported took 0.3-0.5 s, which a judge's construction waited for), unless
the problem left a thread that is not a daemon, which the interpreter's end waits for. Its
stdout is discarded; its stderr goes to a log in its folder, whose last
line is quoted when the probe could not start at all. It runs as a worker does
(:func:`kerneljudge.worker.confine.command`, without Landlock): in PID, mount and network
namespaces of its own where the host allows them, so that whatever the problem's code starts
ends with it, and it ends with the process that started it.

Memory: ``RLIMIT_DATA`` (the child's private writable memory: heap and anonymous mappings,
torch's CPU tensors among them) is capped at ``MEMORY_BYTES``; an allocation past it fails at
once (``MemoryError`` or torch's "can't allocate memory"), without the memory being touched.

A GPU judge's supervisor (``gpu_judge``, where CUDA is visible) runs no more of the problem
than its import, its metadata and ``get_init_inputs`` (``Model`` it constructs only on the
``meta`` device; the workers draw the inputs and run the reference on the GPU), so for it the
probe constructs ``Model`` and calls ``get_inputs`` on the ``meta`` device (tensors with shapes
and no data: a draw of gigabytes costs nothing; a step that fails there, code that needs real
tensors, is done again on the CPU) and makes no reference call: its forward may need a GPU, and
the reference worker's first run on the judging device decides, a failure there being a
:class:`~kerneljudge.errors.ProblemError` too (see :meth:`kerneljudge.judge.Judge.evaluate`).
Every other load (a CPU judge's, whose supervisor draws the first trial's inputs; the lint's;
``kerneljudge profile``'s) is probed on the CPU as described above.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kerneljudge.errors import ProblemError

if TYPE_CHECKING:
    from kerneljudge.worker.spares import Spares

__all__ = ["PROBE_TIMEOUT_S", "WAITING", "ProbeChild", "default_probe_memory", "probe_problem"]

#: Wall-clock limit of one probe (seconds): a fresh interpreter imports torch, then the problem.
PROBE_TIMEOUT_S = 120.0
#: The stage a probe child reports from its start until it has imported torch.
STARTING = "starting the probe"
#: The stage a probe child reports once it has imported torch and waits for its problem.
WAITING = "waiting for the problem"
#: Largest file (bytes) the probed problem may write.
_FSIZE_LIMIT = 16 << 20
_SRC_DIR = str(Path(__file__).resolve().parents[2])
T = TypeVar("T")


def default_probe_memory() -> int:
    """Memory (bytes) a probed problem may allocate: a quarter of this machine's RAM (the
    supervisor, the reference and the candidate each hold the inputs), at least 2 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30
    return max(2 << 30, total // 4)


def probe_problem(
    path: Path,
    timeout_s: float = PROBE_TIMEOUT_S,
    memory_bytes: int | None = None,
    gpu_judge: bool = False,
    spares: Spares | None = None,
) -> tuple[str, bool, dict[str, int]]:
    """Run the problem at ``path`` in a probe child (see the module docstring).

    Args:
        path: the problem file.
        timeout_s: wall-clock limit of the whole probe (seconds), from the moment the child is
            given ``path``.
        memory_bytes: the child's ``RLIMIT_DATA`` (None: :func:`default_probe_memory`).
        gpu_judge: for a GPU judge, whose process draws no inputs: on the ``meta`` device where
            CUDA is visible (else, and for every other use, as its process will: on the CPU).
        spares: where a child started ahead (torch imported, the problem not yet named) is
            taken from (:class:`~kerneljudge.worker.spares.Spares`; None: one starts now).

    Returns:
        ``(the SHA-256 of the source the child ran, whether it drew on the meta device, the
        bytes of the state dict of ``Model`` as the child constructed it per shape set)``.

    Raises:
        ProblemError: one line naming ``path`` and the step that failed: an exception, an exit,
            a signal, more memory than ``memory_bytes``, or no end within ``timeout_s``.
    """
    memory = default_probe_memory() if memory_bytes is None else int(memory_bytes)
    cuda = gpu_judge and _cuda_visible()
    if spares is None:
        child = ProbeChild(memory, cuda)
    else:
        start = functools.partial(ProbeChild, memory, cuda, spare=True)
        now = functools.partial(ProbeChild, memory, cuda)
        child = spares.take(("probe", memory, cuda, _SRC_DIR), start, now=now)
    for fresh in (spares is None, True):
        try:
            code, report = child.run(path, timeout_s)
            given = report.get("stage") not in (None, STARTING, WAITING)
            if code is not None and code != 0 and not given and fresh:
                # It ended before it read the problem's path: its own start failed.
                raise ProblemError(
                    f"{path}: the probe could not start (it {_ending(code)}): {child.last_line()}"
                )
        finally:
            child.close()
        if given or code in (None, 0):
            break
        child = ProbeChild(memory, cuda)  # a spare that died before it was given the problem
    stage = str(report.get("stage", "starting the probe"))
    if code is None:
        raise ProblemError(f"{path}: {stage} did not finish within {timeout_s:g} s")
    if report.get("error"):
        error = str(report["error"])
        raise ProblemError(error if error.startswith(str(path)) else f"{path}: {error}")
    if code != 0 or not report.get("ok"):
        raise ProblemError(f"{path}: the problem {_ending(code)} while {stage}")
    weights = report.get("weight_bytes")
    weight_bytes = {
        str(k): int(v)
        for k, v in (weights.items() if isinstance(weights, dict) else ())
        if isinstance(v, int) and v >= 0
    }
    return str(report.get("sha256", "")), cuda, weight_bytes


class ProbeChild:
    """A probe child, started before it is given its problem: it imports torch, reports
    :data:`WAITING`, then reads the problem's path from its stdin.

    Args:
        memory: its ``RLIMIT_DATA`` (bytes), set once it has the path.
        cuda: it constructs ``Model`` on the ``meta`` device (see the module docstring).
        spare: started ahead of need (:mod:`kerneljudge.worker.spares`): with ``cuda``, while
            it waits it also imports what constructing a model on the ``meta`` device may import
            (``torch._dynamo``, for ``torch.tril`` among others), which counts against
            ``memory`` as any import does (about 80 MiB on the development machine).

    It runs as a worker does (:func:`kerneljudge.worker.confine.command`, without Landlock): in
    PID, mount and network namespaces of its own where the host allows them, and it ends with
    the process that started it.
    """

    def __init__(self, memory: int, cuda: bool, spare: bool = False) -> None:
        from kerneljudge.worker import confine

        # (ignore_cleanup_errors: a process of the problem's may still be ending in its namespace.)
        self._dir = tempfile.TemporaryDirectory(prefix="kj-probe-", ignore_cleanup_errors=True)
        scratch = self._dir.name
        self.result, self.log = Path(scratch) / "result.json", Path(scratch) / "probe.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SRC_DIR, env.get("PYTHONPATH")]))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["TMPDIR"] = scratch
        argv = ["kerneljudge.problem.probe", str(self.result), str(memory)]
        argv += ["cuda" if cuda else "cpu", *(["--spare"] if spare else [])]
        read_end, self._path_fd = os.pipe()
        try:
            with open(self.log, "wb") as errors:
                self.proc = confine.spawn(
                    confine.command(argv, None),
                    stdin=read_end,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    start_new_session=True,
                    cwd=scratch,
                    env=env,
                    die_with_parent=True,  # a probe ends with the judge that started it
                )
        except BaseException:
            os.close(self._path_fd)
            self._dir.cleanup()
            raise
        finally:
            os.close(read_end)
        self._paused = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the child reports :data:`WAITING` (torch imported).

        Raises:
            ProblemError: it ended, or did not report within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while _read(self.result).get("stage") != WAITING:
            if not self.alive() or time.monotonic() > deadline:
                raise ProblemError(f"the probe did not start: {self.last_line()}")
            time.sleep(0.02)

    def pause(self, paused: bool) -> None:
        """Stop or continue the child and its descendants
        (:func:`kerneljudge.worker.sandbox.pause_tree`), unless it has ended."""
        if self.proc.poll() is None and paused != self._paused:
            from kerneljudge.worker.sandbox import pause_tree

            pause_tree(self.proc.pid, paused, launched=False)
            self._paused = paused

    def run(self, path: Path, timeout_s: float) -> tuple[int | None, dict[str, Any]]:
        """Give the child ``path`` and wait for its end, at most ``timeout_s``; returns its
        exit status (None: it was killed at the limit) and its report (empty: none)."""
        self.pause(False)
        try:
            os.write(self._path_fd, os.fsencode(str(path)) + b"\n")
        except OSError:  # it has ended: its status and log say why
            pass
        os.close(self._path_fd)
        self._path_fd = -1
        from kerneljudge.worker.exits import exit_status
        from kerneljudge.worker.process import wait_exited

        try:
            code = exit_status(wait_exited(self.proc, timeout_s))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(self.proc)
        return code, _read(self.result)

    def last_line(self) -> str:
        return _last_line(self.log)

    def close(self) -> None:
        """Kill the child and its group (unless it was reaped: its pid may be another's now),
        and delete its folder."""
        if self.proc.returncode is None:
            _kill_group(self.proc)
        if self._path_fd >= 0:
            os.close(self._path_fd)
            self._path_fd = -1
        self._dir.cleanup()


def _cuda_visible() -> bool:
    """Whether this (the judge's) process sees a CUDA device; asked here, not in the child,
    whose memory limit could make the driver's start-up fail."""
    import torch

    return torch.cuda.is_available()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child and whatever it started in its session, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _last_line(log: Path) -> str:
    """The last non-blank line of the end of ``log`` (what the probe's start printed)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")


def _read(result: Path) -> dict[str, Any]:
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ending(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


# --------------------------------------------------------------------------- the child
class _Report:
    """The child's side of ``RESULT``: each step's name before it runs, then the outcome."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stage = STARTING
        self.started = time.perf_counter()
        #: ``[stage, seconds since the child started]`` of each step as it began.
        self.steps: list[list[Any]] = []

    def write(self, **fields: Any) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"stage": self.stage, "steps": self.steps, **fields}, f)
        os.replace(tmp, self.path)

    def step(self, stage: str) -> None:
        self.stage = stage
        self.steps.append([stage, round(time.perf_counter() - self.started, 4)])
        self.write()


def _limit(memory_bytes: int) -> None:
    for what, value in (
        (resource.RLIMIT_DATA, memory_bytes),
        (resource.RLIMIT_FSIZE, _FSIZE_LIMIT),
    ):
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            pass


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc)


def _on_meta(make: Callable[[str], T], cuda: bool) -> T:
    """``make("meta")`` where CUDA is visible (see the module docstring), else, or where that
    raises, ``make("cpu")``."""
    if cuda:
        try:
            return make("meta")
        except Exception:  # noqa: BLE001 - code that needs real tensors: made on the CPU below
            pass
    return make("cpu")


def _run(problem_path: str, report: _Report, cuda: bool) -> dict[str, Any]:
    """The probe's steps; returns the success report (raises on the first failure)."""
    import torch

    from kerneljudge.problem import Problem

    text = Path(problem_path).read_bytes()
    weight_bytes: dict[str, int] = {}
    report.step("importing the problem")
    problem = Problem.load(problem_path, probe=False)
    report.step("reading its metadata (DTYPE, TOLERANCE, POLICY, SHAPE_SETS)")
    _ = problem.dtype, problem.tolerance, problem.policy
    for name in list(problem.shape_sets) or ["public"]:
        problem.use_shape_set(name)
        where = f" (shape set {name!r})" if problem.shape_sets else ""
        report.step(f"calling get_init_inputs{where}")
        init_inputs = problem.make_init_inputs(0)
        report.step(f"constructing Model{where}")
        model = _on_meta(functools.partial(problem.make_model, 0, init_inputs), cuda)
        weight_bytes[name] = sum(
            t.numel() * t.element_size()
            for t in model.state_dict().values()
            if isinstance(t, torch.Tensor)
        )
        report.step(f"calling get_inputs{where}")
        inputs = _on_meta(lambda dev: problem.make_inputs(0, dev, on_device=True), cuda)
        if cuda:  # the first call: the reference worker's, on the judging device
            continue
        report.step(f"the first reference call{where}")
        with torch.no_grad():
            out = model(*inputs)
        outs = out if isinstance(out, (tuple, list)) else [out]
        if not outs or not all(isinstance(t, torch.Tensor) for t in outs):
            raise ProblemError(
                f"Model.forward{where} returns {type(out).__name__}, not a tensor or a tuple "
                "of tensors"
            )
    report.step("done")
    forward = "left to the reference worker" if cuda else "cpu"
    return {
        "ok": True,
        "sha256": hashlib.sha256(text).hexdigest(),
        "forward": forward,
        "weight_bytes": weight_bytes,
    }


def main(argv: list[str]) -> int:
    result_path, memory = argv[0], int(argv[1])
    cuda = len(argv) > 2 and argv[2] == "cuda"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the supervisor's
    sys.dont_write_bytecode = True
    report = _Report(result_path)
    report.write()
    import torch  # noqa: F401 - what every probe needs, imported before the problem is named

    from kerneljudge.problem import Problem  # noqa: F401

    if cuda and "--spare" in argv[3:]:  # (only the meta device's kernels import it)
        import torch._dynamo  # noqa: F401
    report.stage = WAITING
    report.write()
    problem_path = os.fsdecode(sys.stdin.buffer.read()).removesuffix("\n")
    report.started = time.perf_counter()
    report.stage = "reading the problem file"
    report.write()
    _limit(memory)
    try:
        outcome = _run(problem_path, report, cuda)
    except ProblemError as exc:  # already one line naming the file
        outcome = {"error": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - problem code may raise anything, even SystemExit
        if _out_of_memory(exc):
            error = f"{report.stage} needs more than {memory / 2**30:.1f} GiB of memory"
        else:
            text = f"{type(exc).__name__}: {exc}".strip()
            error = f"{report.stage} raised {next(iter(text.splitlines()), text)}"
        outcome = {"error": error}
    report.write(**outcome)
    main_thread = threading.main_thread()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread):
        return 0  # the interpreter's end waits for the thread the problem left, as it always did
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
