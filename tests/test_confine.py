"""Operating-system confinement of workers (real processes, namespaces and Landlock): nothing a
build or a candidate starts outlives its verdict, nothing outlives a judge killed with SIGKILL,
candidate processes cannot reach the reference, and the audit hook's path holes are closed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kerneljudge import Judge, JudgeConfig, Status, Verdict
from kerneljudge.build import BuildCache, build
from kerneljudge.candidate import Candidate
from kerneljudge.worker import confine, process
from kerneljudge.worker.process import WorkerProcess
from kerneljudge.worker.sandbox import LAUNCH_WAIT_S, child_pids, launching_children

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = Path(__file__).parent / "fixtures" / "tiny_problem.py"
TINY_MODEL = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)
        ESCAPE

    def forward(self, x):
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
"""


def _live(pid: int) -> bool:
    """``pid`` names a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _state(pid: int) -> str:
    """The state letter of ``pid`` (``T``: stopped), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _with_marker(marker: str, *besides: int) -> list[int]:
    """Live processes whose command line contains ``marker`` (but this one and ``besides``)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in (os.getpid(), *besides):
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read() and _live(int(d)):
                    out.append(int(d))
        except OSError:
            continue
    return out


def _gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    """The pids still alive (zombies do not count) after up to ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if _live(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _live(p)]
    return alive


def run_probe(folder: Path, scratch: Path) -> tuple[dict[str, Any], str]:
    """Run ``folder``'s ``kjprobe.py`` confined (``scratch`` its writable folder and working
    directory): the JSON object of its last line of output, and its whole output."""
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{SRC}"}
    proc = confine.spawn(
        confine.command(["kjprobe"], [str(scratch)]),
        env=env,
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    text = proc.communicate(timeout=60)[0].decode()
    return json.loads(text.strip().splitlines()[-1]), text


def _ninja_escape(marker: str, pidfile: str) -> str:
    """Python source that writes a ``build.ninja`` in the working directory whose rule starts
    ``sleep`` with ``marker`` in its own session, double-forked (its parent exits at once),
    runs ``ninja`` (a compiler tool candidates may start) on it, and waits until the sleep's pid
    (as its namespace sees it) is in ``pidfile`` (a shell word)."""
    shell = f"(setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo $! > {pidfile}) &"
    rule = shell.replace("$", "$$")
    return textwrap.dedent(
        f"""
        import os, shutil, subprocess, time
        with open("build.ninja", "w") as f:
            f.write("rule run\\n  command = {rule}\\n")
            f.write("build never: run\\n")
        subprocess.run([shutil.which("ninja"), "-C", os.getcwd()], capture_output=True)
        for _ in range(100):
            if os.path.exists(os.path.expandvars({pidfile!r})):
                break
            time.sleep(0.05)
        """
    )


def test_the_verdict_says_which_confinement_was_in_force() -> None:
    f = confine.features()
    layers = confine.layers("candidate")
    assert "audit_hook" in layers and ("pdeathsig" in layers) == f.enabled
    assert ("pid_namespace" in layers) == bool(f.unshare)
    assert (f"landlock_abi_{f.landlock_abi}" in layers) == (f.landlock_abi > 0)
    v = Verdict(Status.CORRECT, "", "p", "0" * 64, "torch", confinement=layers)
    assert Verdict.from_json(v.to_json()).confinement == layers
    old = json.loads(v.to_json())
    del old["confinement"]
    old["schema_version"] = "1.2"  # written before the field existed
    assert Verdict.from_dict(old).confinement == ()


def test_a_confined_process_reaches_nothing_outside(tmp_path: Path) -> None:
    """Run under the candidates' confinement, a probe cannot write outside its folder, cannot
    leave files in the host's /dev/shm, cannot connect over TCP, and cannot signal, trace or read
    the /proc entry of a reference worker or of the supervisor."""
    f = confine.features()
    if not f.unshare and f.landlock_abi < 6:
        pytest.skip("neither PID namespaces nor Landlock signal scoping on this host")
    reference = WorkerProcess("reference", "cpu")
    try:
        reference.wait_ready()
        ref_pid = child_pids(reference.proc.pid)[-1]  # the python worker under its launcher
        scratch, outside = tmp_path / "scratch", tmp_path / "outside"
        scratch.mkdir()
        outside.mkdir()
        shm_name = f"/dev/shm/kj_test_{secrets.token_hex(4)}"
        (tmp_path / "kjprobe.py").write_text(
            textwrap.dedent(
                f"""
                import ctypes, json, os, socket
                out = {{}}
                def attempt(name, fn):
                    try:
                        fn()
                        out[name] = "done"
                    except OSError as exc:
                        out[name] = exc.__class__.__name__
                def write(path):
                    with open(path, "w") as f:
                        f.write("x")
                def ptrace(pid):
                    libc = ctypes.CDLL(None, use_errno=True)
                    if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
                        raise OSError(ctypes.get_errno(), "ptrace")
                attempt("write_scratch", lambda: write({str(scratch / "ok")!r}))
                attempt("write_outside", lambda: write({str(outside / "no")!r}))
                attempt("write_shm", lambda: write({shm_name!r}))
                attempt("tcp", lambda: socket.create_connection(("127.0.0.1", 9), timeout=2))
                for who, pid in (("reference", {ref_pid}), ("supervisor", {os.getpid()})):
                    attempt("kill_" + who, lambda: os.kill(pid, 0))
                    attempt("ptrace_" + who, lambda: ptrace(pid))
                    attempt("environ_" + who, lambda: open(f"/proc/{{pid}}/environ").read())
                print(json.dumps(out))
                """
            )
        )
        out, text = run_probe(tmp_path, scratch)
    finally:
        reference.close()
    assert out.pop("write_scratch") == "done", text
    assert not os.path.exists(shm_name), "the write reached the host's /dev/shm"
    if out["write_shm"] == "done":
        assert f.private_shm  # its own tmpfs
    out.pop("write_shm")
    assert all(v != "done" for v in out.values()), out


def test_processes_started_through_ninja_in_a_build_end_with_the_build(tmp_path: Path) -> None:
    """The audited escape: a build.ninja the candidate wrote starts a double-forked, setsid'd
    process; it must not outlive the build."""
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    source = _ninja_escape(marker, "escaped.pid") + textwrap.dedent(
        """
        import torch.nn as nn


        def unused():
            from torch.utils.cpp_extension import load_inline

            return load_inline(name="never", cpp_sources="", functions=[])


        class ModelNew(nn.Module):
            def forward(self, x):
                return x
        """
    )
    cand = Candidate.from_source(source, name="escape.py")
    assert cand.backend == "cpp"
    cache = BuildCache(tmp_path / "cache")
    result = build(cand, cache=cache, arch="", timeout_s=120)
    entry = cache.entry(cache.key(cand, ""))
    assert (entry / "escaped.pid").read_text().strip(), result.log  # the escape did run
    assert _gone(_with_marker(marker), 10.0) == []


def test_processes_a_candidate_starts_end_with_its_verdict(tmp_path: Path) -> None:
    """A candidate whose ModelNew.__init__ starts, through ninja, a double-forked, setsid'd
    process: it must be gone once the verdict is out."""
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    escape = _ninja_escape(marker, "escaped.pid")
    escape = "\n            ".join(["if True:", *escape.strip().splitlines()])
    path = tmp_path / "cand.py"
    path.write_text(TINY_MODEL.replace("ESCAPE", escape))
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path / "cache",
        run_timeout_s=30.0,
        baselines=("eager",),
        timing=False,
        threads=1,
    )
    with Judge(TINY, config) as judge:
        verdict = judge.evaluate(path)
        assert verdict.confinement == confine.layers("candidate")
        # The escape did run: the worker saw what it started still running after the call.
        assert verdict.status is Status.REJECTED and "process" in verdict.reason, verdict
        assert _gone(_with_marker(marker), 10.0) == [], verdict.reason
    assert _with_marker(marker) == []


_KILLED_JUDGE = """
import json, sys, threading, time
from pathlib import Path
from typing import Any
from kerneljudge import Judge, JudgeConfig
from kerneljudge.worker.process import WorkerProcess
from kerneljudge.worker.sandbox import LAUNCH_WAIT_S, child_pids, launching_children

judge = Judge(Path(sys.argv[1]), JudgeConfig(device="cpu", cache_dir=sys.argv[2], threads=1))
pool = judge._pool("cpu")
pool.prestart()
for w in pool._idle:
    w.wait_ready()
box = []
# A worker started from a thread that ends at once (as the reference's preparation thread does).
t = threading.Thread(target=lambda: box.append(WorkerProcess("reference", "cpu")))
t.start()
t.join()
box[0].wait_ready()
time.sleep(0.5)
with pool.paused():
    pids = [p for w in [*pool._idle, box[0]] for p in [w.proc.pid, *child_pids(w.proc.pid)]]
    print(json.dumps(pids), flush=True)
    time.sleep(600)
"""


def test_workers_end_with_a_judge_killed_by_sigkill(tmp_path: Path) -> None:
    """A judge process holding stopped spare workers and a reference worker (started from a
    thread that has ended) is killed with SIGKILL: every one of their processes ends."""
    script = tmp_path / "judge.py"
    script.write_text(_KILLED_JUDGE)
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(TINY), str(tmp_path / "cache")],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else b""
        pids = json.loads(line)
        assert len(pids) >= 3 and all(_live(p) for p in pids), pids  # stopped, not dead
        deadline = time.monotonic() + 10
        while _state(pids[0]) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)  # a signal is delivered when the process next runs
        assert _state(pids[0]) == "T"  # the spare worker is stopped
        _kill_and_expect_gone(proc, pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _kill_and_expect_gone(proc: subprocess.Popen[bytes], pids: list[int]) -> None:
    """SIGKILL ``proc``, reap it, and assert that every one of ``pids`` ends with it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone(pids) == []


_HOOK = """
import json, os, sys
from kerneljudge.worker.sandbox import Sandbox

scratch, outside = sys.argv[1], sys.argv[2]
os.chdir(scratch)
box = Sandbox([scratch])
box.install()
out = {}

def attempt(name, fn):
    box.armed = True
    try:
        fn()
        out[name] = "done"
    except PermissionError:
        out[name] = "refused"
    finally:
        box.armed = False

def close(fd):
    os.close(fd)

attempt("scratch", lambda: open("ok.txt", "w").close())
attempt("dev_null", lambda: open("/dev/null", "w").close())
attempt("dev_shm", lambda: open("/dev/shm/kj_hook_test", "w").close())
attempt("dev_other", lambda: open("/dev/kj_hook_test", "w").close())
dir_fd = os.open(outside, os.O_RDONLY | os.O_DIRECTORY)
attempt("open_dir_fd", lambda: close(os.open("x", os.O_WRONLY | os.O_CREAT, dir_fd=dir_fd)))
attempt("mkdir_dir_fd", lambda: os.mkdir("d", dir_fd=dir_fd))
attempt("rename_dir_fd", lambda: os.rename("ok.txt", "moved", dst_dir_fd=dir_fd))
os.close(dir_fd)
proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
parent = str(os.getppid())
attempt("proc_dir_fd", lambda: close(os.open(parent + "/environ", os.O_RDONLY, dir_fd=proc_fd)))
os.close(proc_fd)
attempt("proc_root", lambda: open(f"/proc/self/root/proc/{parent}/environ").close())
attempt("proc_dotdot", lambda: open(f"/proc/self/../{parent}/environ").close())
attempt("proc_own", lambda: open("/proc/self/status").close())
print(json.dumps(out))
"""


def test_the_audit_hook_judges_names_where_they_lead(tmp_path: Path) -> None:
    """Directory-fd-relative writes, /dev paths off the short list and other processes' /proc
    entries (through a /proc fd, /proc/self/root or ..) are refused; the scratch folder, /dev/null
    and the process's own /proc entries are not."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", _HOOK, str(scratch), str(outside)],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    allowed = {"scratch", "dev_null", "proc_own"}
    assert {k for k, v in got.items() if v == "done"} == allowed, got
    assert list(outside.iterdir()) == []


def test_workers_start_in_their_own_namespaces_and_keep_the_protocol(tmp_path: Path) -> None:
    """A confined candidate worker answers requests; pause, rss and kill reach all its
    processes through their host pids."""
    if not confine.features().unshare:
        pytest.skip("no PID namespaces on this host")
    w = WorkerProcess("candidate", "cpu", threads=1)
    try:
        w.wait_ready()
        pids = [w.proc.pid, *child_pids(w.proc.pid)]
        assert len(pids) >= 3  # launcher, namespace init, worker
        ns = {os.readlink(f"/proc/{p}/ns/pid") for p in pids[1:]}
        assert ns != {os.readlink("/proc/self/ns/pid")} and len(ns) == 1
        assert w.rss_bytes() > 50 << 20
        w.pause(True)
        deadline = time.monotonic() + 10
        while {_state(p) for p in pids} != {"T"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {_state(p) for p in pids} == {"T"}
        w.pause(False)
    finally:
        w.close()
    assert _gone(pids, 10.0) == []


_UNPRIVILEGED = """
import importlib.util, json, os, subprocess, sys
spec = importlib.util.spec_from_file_location("confine", sys.argv[1])
confine = importlib.util.module_from_spec(spec)
sys.modules["confine"] = confine
spec.loader.exec_module(confine)
base = sys.argv[2]
scratch = os.path.join(base, "scratch")
with open(os.path.join(base, "kjprobe.py"), "w") as f:
    f.write('''
import json, os, sys
out = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = type(exc).__name__
def write(path):
    with open(path, "w") as f:
        f.write("x")
attempt("write_scratch", lambda: write(os.path.join(sys.argv[1], "ok")))
attempt("write_outside", lambda: write(os.path.join(sys.argv[1], "..", "outside")))
attempt("kill_supervisor", lambda: os.kill(int(sys.argv[2]), 0))
print(json.dumps(out))
''')
env = {"PATH": os.environ["PATH"], "PYTHONPATH": base, "HOME": base}
cmd = confine.command(["kjprobe", scratch, str(os.getpid())], [scratch])
p = confine.spawn(cmd, env=env, cwd=scratch, stdout=subprocess.PIPE)
probe = json.loads(p.communicate(timeout=60)[0].decode().strip().splitlines()[-1])
print(json.dumps({"layers": confine.layers("candidate"), "probe": probe, "uid": os.getuid()}))
"""


def test_confinement_works_for_an_unprivileged_user() -> None:
    """The same confinement, started by an unprivileged supervisor (user ``nobody``, through
    ``setpriv``): a user namespace makes the other namespaces possible. The supervisor here is
    the system's Python with ``confine.py`` loaded by path (standard library only)."""
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(python) or not confine.features().setpriv:
        pytest.skip("needs root (to become nobody), setpriv and a system python3")
    base = Path(tempfile.mkdtemp(prefix="kj-unpriv-"))
    try:
        base.chmod(0o777)
        (base / "scratch").mkdir(mode=0o777)
        (base / "scratch").chmod(0o777)
        script = base / "supervisor.py"
        script.write_text(_UNPRIVILEGED)
        script.chmod(0o644)
        out = subprocess.run(
            [confine.features().setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
            + [python, "-I", str(script), confine.__file__, str(base)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if "Permission denied" in out.stderr and "confine.py" in out.stderr:
            pytest.skip("the source tree is not readable by nobody")
        got = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert got["uid"] == 65534
    probe = got["probe"]
    assert probe["write_scratch"] == "done" and probe["write_outside"] != "done", got
    assert probe["kill_supervisor"] != "done", got
    if "pid_namespace" in got["layers"]:
        assert "user_namespace" in got["layers"] and len(probe["pids"]) <= 3, got


def test_an_ended_worker_is_never_signalled_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a worker has ended and been reaped, its pid may be a newer process's (another
    judge's worker): pausing, continuing or killing it sends no signal to that pid."""
    worker = WorkerProcess("candidate", "cpu")
    try:
        worker.wait_ready()
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=30)  # reaped: the pid is free for the system to reuse
        sent: list[tuple[int, int]] = []
        monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
        monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append((-pid, sig)))
        # the pid now names a process that started at another time: another's, not the worker's
        monkeypatch.setattr(process, "start_ticks", lambda pid: "another start")
        worker.pause(True)
        worker.pause(False)
        worker.kill()
        assert sent == []
    finally:
        monkeypatch.undo()
        worker.close()


def test_weights_seed_is_derived_from_the_judges_seed() -> None:
    """The weights' seed reaches candidates' workers; the configured seed (the run seed of
    every verdict) must not: the one is a one-way derivation of the other."""
    from kerneljudge.judge.reference_side import derive_seed, weight_seed_of

    assert weight_seed_of(7) == weight_seed_of(7) == derive_seed(7, "weights") != 7
    assert weight_seed_of(None) != weight_seed_of(None)


_PR_GET_PDEATHSIG = 2
_PRINT_PDEATHSIG = (
    "import ctypes; s = ctypes.c_int(-1); "
    f"ctypes.CDLL(None).prctl({_PR_GET_PDEATHSIG}, ctypes.byref(s), 0, 0, 0); print(s.value)"
)


def test_a_spawned_child_is_armed_before_exec_or_never_runs() -> None:
    """``confine.spawn`` arms the child's parent-death signal (SIGKILL) between fork and exec;
    a child whose parent is not the one it was armed for (it died before the arming, so no
    signal would come) exits before its command runs."""
    proc = confine.spawn(
        [sys.executable, "-c", _PRINT_PDEATHSIG], die_with_parent=True, stdout=subprocess.PIPE
    )
    out, _ = proc.communicate(timeout=60)
    assert out.decode().strip() == str(int(signal.SIGKILL))
    orphan = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        preexec_fn=confine._die_with(os.getpid() + 1),  # not this child's parent
        capture_output=True,
        timeout=60,
    )
    assert orphan.returncode == 1 and orphan.stdout == b""


_PROBING_JUDGE = """
import sys
from kerneljudge.problem.probe import probe_problem
probe_problem(sys.argv[1], 600.0, None, False)
"""


def test_a_problems_probe_ends_with_the_judge_killed_by_sigkill(tmp_path: Path) -> None:
    """A process probing a problem whose import never ends is killed with SIGKILL: the probe
    child (in a session of its own, where a group kill from the judge cannot reach it) ends
    with it."""
    running = tmp_path / "running"
    problem = tmp_path / "stuck.py"
    problem.write_text(
        f"import time\nopen({str(running)!r}, 'w').close()\nwhile True:\n    time.sleep(1)\n"
    )
    script = tmp_path / "judge.py"
    script.write_text(_PROBING_JUDGE)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(problem)], env={**os.environ, "PYTHONPATH": SRC}
    )
    try:
        deadline = time.monotonic() + 120
        while not running.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running.exists(), "the problem's code did not start in its probe"
        # (The probe reads the problem's path on its stdin: found as the judge's descendants.)
        probes = child_pids(proc.pid)
        assert probes, "the probe did not start"
        _kill_and_expect_gone(proc, probes)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_DETACHING_PROBLEM = """
import subprocess
subprocess.Popen(["sleep", "{seconds}"], start_new_session=True)  # outlives its parent's exit

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.ones(2)]


def get_init_inputs():
    return []
"""


@pytest.mark.skipif(not confine.features().unshare, reason="needs PID namespaces")
def test_what_a_problems_code_starts_in_its_probe_ends_with_the_probe(tmp_path: Path) -> None:
    """A problem file whose import starts a process in a session of its own: the probe passes,
    and that process has ended with it (the probe runs in a PID namespace of its own)."""
    from kerneljudge.problem.probe import probe_problem

    seconds = f"{600 + secrets.randbelow(10**6) / 10**6:.6f}"  # a marker in its command line
    problem = tmp_path / "detaching.py"
    problem.write_text(_DETACHING_PROBLEM.format(seconds=seconds))
    try:
        probe_problem(problem, 300.0)
        assert _gone(_with_marker(seconds), timeout_s=10.0) == []
    finally:
        for pid in _with_marker(seconds):
            os.kill(pid, signal.SIGKILL)


def test_a_probe_that_cannot_start_says_so_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe whose confinement fails before any of its own code runs (here a stand-in for an
    ``unshare`` the host refuses) is reported as the probe's start, with what it printed, not
    as the problem's failure."""
    from kerneljudge.errors import ProblemError
    from kerneljudge.problem.probe import probe_problem

    refuse = "echo 'unshare: unshare failed: Operation not permitted' >&2; exit 1"
    monkeypatch.setattr(confine, "command", lambda argv, writable: ["sh", "-c", refuse])
    problem = tmp_path / "fine.py"
    problem.write_text(_DETACHING_PROBLEM.replace("subprocess.Popen", "print"))
    with pytest.raises(ProblemError, match="probe could not start") as raised:
        probe_problem(problem, 60.0)
    assert str(raised.value).endswith("unshare: unshare failed: Operation not permitted")


@pytest.mark.skipif(not confine.features().unshare, reason="needs PID namespaces")
def test_a_confined_child_of_pid_1_runs() -> None:
    """Where the supervisor is itself PID 1 (a container's only process) and no namespace is
    made, its confined child's parent is PID 1 from the start: that is its parent alive, not
    a sign that it died."""
    policy = json.dumps({"pdeathsig": True, "init": False, "parent": 1})
    child = [sys.executable, "-P", confine.__file__, policy, "--", "platform"]
    pid_1 = f"import subprocess, sys; sys.exit(subprocess.run({child!r}).returncode)"
    unshare = [*confine.features().unshare[:-1], "--", sys.executable, "-c", pid_1]
    out = subprocess.run(unshare, capture_output=True, timeout=60, text=True)
    assert out.returncode == 0 and "Linux" in out.stdout, out.stderr


def _awaited_state(pid: int, want: str = "T", wait_s: float = 2.0) -> str:
    """:func:`_state` of ``pid`` once it is ``want`` or after ``wait_s`` (a signal takes
    effect when the process next runs)."""
    deadline = time.monotonic() + wait_s
    state = _state(pid)
    while state != want and time.monotonic() < deadline:
        time.sleep(0.01)
        state = _state(pid)
    return state


def _comm(pid: int) -> str:
    """Process ``pid``'s name (``/proc/PID/comm``), empty once it has ended."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("ready", [False, True])
def test_a_starting_worker_is_not_stopped_before_its_launcher_child_runs_python(
    tmp_path: Path, ready: bool
) -> None:
    """``unshare --fork --kill-child`` arms its child's parent-death signal after the fork: a
    child stopped before that outlives a supervisor killed meanwhile, stopped for good. A stop
    of a worker not yet ready leaves a child still running the launcher's code (``unshare``)
    running; a ready worker's processes are all stopped, whatever they are called (a
    candidate could name its own process ``unshare``)."""
    launcher = tmp_path / "unshare"  # a process whose name is the launcher's
    shutil.copy(shutil.which("sleep") or "/bin/sleep", launcher)
    other = tmp_path / "other"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", other)
    parent = subprocess.Popen(["sh", "-c", f"{launcher} 30 & {other} 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        kids: dict[str, int] = {}
        while set(kids) != {"unshare", "other"} and time.monotonic() < deadline:
            time.sleep(0.01)  # both forked and both exec'd (a forked shell is still "sh")
            kids = {_comm(p): p for p in child_pids(parent.pid)}
        assert launching_children(parent.pid) == {kids["unshare"]}
        worker = object.__new__(WorkerProcess)
        worker.proc = parent
        worker.ready = ready
        t0 = time.monotonic()
        worker.pause(True)
        waited = time.monotonic() - t0
        try:
            assert _awaited_state(kids["other"]) == "T"
            assert _awaited_state(parent.pid) == "T"
            launching = _awaited_state(kids["unshare"], "T", 2.0 if ready else 0.3)
            assert launching == ("T" if ready else "S")
            if not ready:
                assert waited >= LAUNCH_WAIT_S * 0.9
        finally:
            worker.pause(False)
        assert _awaited_state(kids["other"], "S") != "T"
        assert _awaited_state(kids["unshare"], "S") != "T"
    finally:
        for p in [*child_pids(parent.pid), parent.pid]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()


def test_the_references_compile_cache_lies_where_no_candidate_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`~kerneljudge.judge.reference_side.reference_environment`: the build cache's
    ``inductor`` folder where Landlock confines every writer, and nothing where a folder a
    candidate may write lies beneath or above it, where it is a link, or where the judge's
    environment names the caches already."""
    from kerneljudge.judge.reference_side import reference_environment

    cache = tmp_path / "cache"
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"):
        monkeypatch.delenv(var, raising=False)
    if confine.features().landlock_abi < 3:
        assert reference_environment(cache) == {}
        pytest.skip("no Landlock ABI 3 on this host: the reference's compile cache is not kept")
    folder = cache.resolve() / "inductor"
    assert reference_environment(cache) == {
        "TORCHINDUCTOR_CACHE_DIR": str(folder),
        "TRITON_CACHE_DIR": str(folder / "triton"),
    }
    assert reference_environment(Path.home() / ".triton" / "kj") == {}
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path))  # above the cache: a candidate's
    assert reference_environment(cache) == {}
    monkeypatch.setenv("CUDA_CACHE_PATH", str(folder / "nv"))  # beneath the folder
    assert reference_environment(cache) == {}
    monkeypatch.delenv("CUDA_CACHE_PATH")
    # The judge's own values (which candidates inherit) are not the reference's, and may not
    # lie above or beneath its folder.
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "mine"))
        assert reference_environment(cache)["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
        monkeypatch.setenv(var, str(folder / "x"))
        assert reference_environment(cache) == {}
        monkeypatch.delenv(var)
    # Candidate workers' scratch folders (kj-* in the temporary folder) beneath it, or it
    # beneath one of them.
    monkeypatch.setattr(tempfile, "tempdir", str(folder / "tmp"))
    assert reference_environment(cache) == {}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert reference_environment(tmp_path / "kj-candidate-x" / "c") == {}
    assert reference_environment(cache)["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    # In a judging host the temporary folder is its own, in the base one beside the other
    # hosts' (kerneljudge.worker.host_tmp): their workers' scratch folders are refused too.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "kerneljudge-slot-mine"))
    assert reference_environment(tmp_path / "kerneljudge-slot-other" / "kj-candidate-y") == {}
    assert reference_environment(tmp_path / "kj-candidate-x" / "c") == {}
    assert reference_environment(cache)["TORCHINDUCTOR_CACHE_DIR"] == str(folder)
    monkeypatch.undo()
    cache.mkdir()
    folder.symlink_to(tmp_path, target_is_directory=True)
    assert reference_environment(cache) == {}


@pytest.mark.slow  # torch.compile of the reference, twice: tens of seconds on two cores
def test_the_references_compile_cache_outlives_its_judge_and_no_candidate_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Landlock, the reference workers keep ``torch.compile``'s cache in the build cache's
    ``inductor`` folder (:func:`kerneljudge.judge.reference_side.reference_environment`): a
    second judge finds what the first compiled, and a candidate's native write there fails."""
    from kerneljudge.judge.reference_side import reference_environment
    from kerneljudge.timing import TimingConfig

    # Inductor sets this in any process that compiled once: here, an earlier test's.
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache = tmp_path / "cache"
    if not reference_environment(cache):
        pytest.skip("the reference's compile cache is not kept here (no Landlock ABI 3)")
    folder = cache.resolve() / "inductor"
    poison = folder / "poison"
    # torch.save opens a path in C++: the audit hook does not see it, only Landlock stops it.
    escape = (
        "if True:\n            try:\n                torch.save(torch.zeros(1), "
        f"{str(poison)!r})\n            except RuntimeError:\n                pass"
    )
    path = tmp_path / "cand.py"
    path.write_text(TINY_MODEL.replace("ESCAPE", escape))
    config = JudgeConfig(
        device="cpu",
        cache_dir=cache,
        baselines=("eager", "compile"),
        timing_config=TimingConfig(max_time_s=0.2),
        threads=1,
    )
    kept: list[set[Path]] = []
    for _ in range(2):
        with Judge(TINY, config) as judge:
            verdict = judge.evaluate(path)
        assert verdict.status is Status.CORRECT, verdict.reason
        assert {m.name for m in verdict.timing.measurements} >= {"eager", "compile"}
        kept.append({p for p in folder.rglob("*") if p.is_file()})
        assert not poison.exists()
    assert kept[0], "the first judge's compile left nothing in the cache"
    # The second judge compiled nothing new: its graph was found, not written again.
    assert kept[1] == kept[0]


def test_the_jit_caches_a_candidate_writes_follow_its_environment() -> None:
    """:func:`~kerneljudge.worker.environment.jit_cache_folders`: the one list the candidate
    worker's Landlock rules, its audit hook and the reference's compile cache check read."""
    from kerneljudge.worker.environment import jit_cache_folders

    env = {"HOME": "/h"}
    assert jit_cache_folders(env, cuda=False) == ["/h/.triton"]
    assert jit_cache_folders(env, cuda=True) == ["/h/.triton", "/h/.nv"]
    env |= {"CUDA_CACHE_PATH": "/c", "TRITON_CACHE_DIR": "/t", "TORCHINDUCTOR_CACHE_DIR": "/i"}
    assert jit_cache_folders(env, cuda=True) == ["/h/.triton", "/c", "/t", "/i"]
    assert jit_cache_folders(env, cuda=False) == ["/h/.triton", "/t", "/i"]


def test_a_reference_worker_never_loads_torchs_kernel_cache_from_disk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernels a reference worker compiles at run time (the digest's and the comparison's,
    through jiterator) are not looked up in torch's kernel cache on disk, which a candidate
    may write to: its environment turns that cache off, whatever the supervisor's says."""
    monkeypatch.setenv("USE_PYTORCH_KERNEL_CACHE", "1")
    seen = {}
    for role in ("reference",):
        w = WorkerProcess(role, "cpu", threads=1)
        try:
            w.wait_ready()
            with open(f"/proc/{w.worker_pid()}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            seen[role] = env.get(b"USE_PYTORCH_KERNEL_CACHE")
        finally:
            w.close()
    assert seen == {"reference": b"0"}


def test_a_profiled_worker_leaves_its_request_profile_and_no_link_is_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the profile variable set, a closed worker's request profile is copied to its folder;
    a link the worker left in its scratch folder in place of the memory log is not followed (a
    CPU worker writes no memory log)."""
    from kerneljudge.worker.profiling import MEMORY_FILE, PROFILE_ENV

    kept = tmp_path / "profiles"
    kept.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("the supervisor's file")
    monkeypatch.setenv(PROFILE_ENV, str(kept))
    w = WorkerProcess("candidate", "cpu", threads=1)
    try:
        w.wait_ready()
        w.request("pin", timeout_s=60, cpus=sorted(os.sched_getaffinity(0)), threads=1)
        (w.scratch / MEMORY_FILE).symlink_to(secret)
    finally:
        w.close()
    names = sorted(p.name for p in kept.iterdir())
    assert names == [f"candidate-{w.id}.prof"], names
    import pstats

    assert pstats.Stats(str(kept / names[0])).total_calls > 0  # a whole profile


def _pinned_then_closed() -> WorkerProcess:
    """A CPU candidate worker that answered one request, then closed."""
    w = WorkerProcess("candidate", "cpu", threads=1)
    try:
        w.wait_ready()
        w.request("pin", timeout_s=60, cpus=sorted(os.sched_getaffinity(0)), threads=1)
    finally:
        w.close()
    return w


def test_the_memory_variable_alone_keeps_no_request_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With only the memory variable set, a worker runs no cProfile: a closed CPU worker (which
    writes no memory log) leaves nothing in the folder, and a profiler made under the variable
    records memory without a profile."""
    from kerneljudge.worker.profiling import MEMORY_ENV, PROFILE_ENV, RequestProfiler

    kept = tmp_path / "memory"
    kept.mkdir()
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setenv(MEMORY_ENV, str(kept))
    assert not _pinned_then_closed().scratch.exists()
    assert list(kept.iterdir()) == []
    profiler = RequestProfiler()
    assert profiler.profile is None and profiler.memory


def test_a_profile_folder_that_is_missing_is_made_and_closing_still_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker closed with the profile variable naming a folder that does not exist yet
    closes cleanly: the folder is made, the profile copied, the scratch folder removed."""
    from kerneljudge.worker.profiling import PROFILE_ENV

    kept = tmp_path / "not" / "there"
    monkeypatch.setenv(PROFILE_ENV, str(kept))
    w = _pinned_then_closed()
    assert [p.suffix for p in kept.iterdir()] == [".prof"]
    assert not w.scratch.exists()


def test_waiting_for_a_process_to_end_returns_its_status_at_its_end_or_raises_at_the_limit() -> (
    None
):
    """``wait_exited`` reports the exit status, returns once the process ends (not at the next
    of ``Popen.wait``'s growing sleeps), raises at its limit, and leaves a reaped process as is."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait_exited(sleeper, 0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
    assert process.wait_exited(sleeper, 5) == -signal.SIGKILL
    assert process.wait_exited(sleeper, 5) == -signal.SIGKILL  # reaped: the recorded status
    ends = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(7)"]
    )
    assert process.wait_exited(ends, 30) == 7


def test_no_confined_process_is_given_a_protected_folder_through_a_link(tmp_path: Path) -> None:
    """A folder a candidate may write, replaced by a link to a protected folder (the
    reference's compile cache), or a writable folder above a protected one, is dropped from the
    rules of every process started after it was protected; the others stay, in order."""
    from kerneljudge.worker.confine import protect

    protected = tmp_path / "cache" / "inductor"
    protected.mkdir(parents=True)
    protect(protected)
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    (mine / "triton").symlink_to(protected, target_is_directory=True)
    writable = [mine / "triton", mine, protected / "x", tmp_path / "cache", other]
    cmd = confine.command(["kjprobe"], [str(p) for p in writable])
    policy = json.loads(cmd[-3])  # ... python -P confine.py POLICY -- kjprobe
    assert [w for w in policy["write"] if w != os.path.realpath("/dev/shm")] == [
        os.path.realpath(mine),
        os.path.realpath(other),
    ]


def test_a_folder_reached_through_a_link_in_a_writable_folder_gets_no_rule(tmp_path: Path) -> None:
    """Whoever made it, a link lying in a folder the process may write (one a candidate could
    have made) takes the folders reached through it out of the rules, with nothing protected;
    a link in a folder no rule covers (the host's own) is followed."""
    mine, elsewhere, other = tmp_path / "mine", tmp_path / "elsewhere", tmp_path / "other"
    for folder in (mine, elsewhere, other):
        folder.mkdir()
    (mine / "triton").symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / "alias").symlink_to(other, target_is_directory=True)
    writable = [mine, mine / "triton" / "0", tmp_path / "alias"]
    cmd = confine.command(["kjprobe"], [str(p) for p in writable])
    policy = json.loads(cmd[-3])
    assert [w for w in policy["write"] if w != os.path.realpath("/dev/shm")] == [
        os.path.realpath(mine),
        os.path.realpath(other),
    ]


def test_a_writable_folder_that_opens_as_another_path_gets_no_rule(tmp_path: Path) -> None:
    """In the confined child, a writable folder that is a link when its rule is made (one made
    after the supervisor resolved the folders) is left out: nothing beneath its target can be
    written; a real folder beside it can."""
    abi = confine.features().landlock_abi
    if abi < 1:
        pytest.skip("no Landlock on this host")
    real, link, ok = tmp_path / "real", tmp_path / "link", tmp_path / "ok"
    real.mkdir()
    ok.mkdir()
    link.symlink_to(real, target_is_directory=True)
    (tmp_path / "kjwrite.py").write_text(
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
    )
    policy = {"landlock": abi, "write": [str(link), str(ok)], "devices": []}
    cmd = [sys.executable, "-P", confine.__file__, json.dumps(policy), "--", "kjwrite"]
    out = subprocess.run(
        [*cmd, str(real / "f"), str(ok / "f")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=True,
    ).stdout.split("\n")
    assert out[:2] == [f"{real / 'f'} PermissionError", f"{ok / 'f'} written"]
    assert not (real / "f").exists()
