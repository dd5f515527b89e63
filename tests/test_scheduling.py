"""A confined worker cannot change its own CPU scheduling; the supervisor pins it from outside
(kerneljudge.worker.scheduling). A worker that could raise its priority or leave the timing core
ran its calls away from the load the reference's calls shared that core with
(tests/adversarial/cpu/cheat_sched_priority.py, cheat_sched_affinity.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_confine import run_probe

from kerneljudge.worker import confine, scheduling

SRC = str(Path(__file__).resolve().parents[1] / "src")

_PROBE = """
import json, os, threading
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = exc.errno
others = {c for c in range(os.cpu_count() or 1)} - {min(os.sched_getaffinity(0))}
attempt("affinity", lambda: os.sched_setaffinity(0, others or {0}))
attempt("fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10)))
attempt("rr", lambda: os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10)))
attempt("nice_down", lambda: os.setpriority(os.PRIO_PROCESS, 0, -20))
attempt("nice_up", lambda: os.nice(1))
attempt("param", lambda: os.sched_setparam(0, os.sched_param(0)))
t = threading.Thread(target=attempt, args=("thread_affinity",
                     lambda: os.sched_setaffinity(0, others or {0})))
t.start()
t.join()
attempt("read", lambda: (os.sched_getaffinity(0), os.getpriority(os.PRIO_PROCESS, 0)))
print(json.dumps(out))
"""


def _needs_lock() -> None:
    if not confine.features().scheduling:
        pytest.skip("no seccomp filter on this machine (or confinement off)")


def test_a_confined_process_cannot_change_its_scheduling(tmp_path: Path) -> None:
    """Affinity, policy, priority and nice are refused (EPERM) in a confined process and its
    threads, reading them is not; the layer is named in the verdict's confinement."""
    _needs_lock()
    (tmp_path / "kjprobe.py").write_text(_PROBE)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out, text = run_probe(tmp_path, scratch)
    assert out.pop("read") == "done", text
    assert out == {name: 1 for name in out}, out  # EPERM, every one
    assert "scheduling_locked" in confine.layers("candidate")
    assert "scheduling_locked" not in confine.layers("reference")


def test_the_filter_refuses_another_abi_and_only_the_listed_calls() -> None:
    """The program as built: a foreign architecture refused, x32 numbers refused on x86-64,
    the listed numbers refused, everything else allowed."""
    arch, numbers = scheduling.LOCKED_SYSCALLS["x86_64"]
    prog = scheduling._program(arch, numbers, x32=True)

    def run(nr: int, a: int) -> int:  # a small BPF interpreter for this program's opcodes
        pc, acc = 0, 0
        while True:
            code, jt, jf, k = prog[pc]
            if code == scheduling._LD_W_ABS:
                acc = a if k == scheduling._ARCH_OFFSET else nr
                pc += 1
            elif code == scheduling._RET_K:
                return k
            else:
                hit = acc == k if code == scheduling._JEQ_K else acc >= k
                pc += 1 + (jt if hit else jf)

    deny = scheduling._SECCOMP_RET_ERRNO | 1
    assert all(run(nr, arch) == deny for nr in numbers)
    assert run(203 | scheduling._X32_SYSCALL_BIT, arch) == deny
    assert run(0, 0x40000003) == deny  # i386
    for nr in (0, 1, 57, 202, 204, 143, 145, 315):  # read, write, fork, futex, getaffinity, ...
        assert run(nr, arch) == scheduling._SECCOMP_RET_ALLOW


def test_pin_tree_pins_every_thread_of_a_process_tree() -> None:
    """From outside: the threads of a child and of its own child, started before the pin, all
    end on the cores given; a thread started after inherits them."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    code = textwrap.dedent(
        """
        import os, subprocess, sys, threading, time
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        print(kid.pid, flush=True)
        sys.stdin.readline()
        seen = []
        t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        t.start(); t.join()
        print(seen[0], sorted(os.sched_getaffinity(0)), flush=True)
        kid.kill()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        kid = int(proc.stdout.readline())
        core = max(os.sched_getaffinity(0))
        assert scheduling.pin_tree(proc.pid, {core})
        for pid in (proc.pid, kid):
            for task in os.listdir(f"/proc/{pid}/task"):
                assert os.sched_getaffinity(int(task)) == {core}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == [f"[{core}]", f"[{core}]"]
    finally:
        proc.kill()
        proc.wait()


def test_pin_tree_of_a_process_that_ended_says_so() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not scheduling.pin_tree(proc.pid, {0}, passes=2)


_PARALLEL = """
import torch
import torch.nn as nn

torch.set_num_threads(2)  # an OpenMP region of two threads: libgomp starts a second one


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)

    def forward(self, x):
        torch.ones(1 << 20).add_(1.0)  # parallel over both threads
        return torch.relu(self.lin(x)).sum(-1, keepdim=True) * x
"""


@pytest.mark.skipif(not confine.features().scheduling, reason="no seccomp filter here")
def test_openmp_thread_binding_reaches_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY set, libgomp binds every thread it
    # starts; under the scheduling lock it cannot and aborts the worker ("Thread creation
    # failed: Operation not permitted"): every candidate that ran a parallel region failed.
    from kerneljudge import Judge, JudgeConfig, Status, TimingConfig

    monkeypatch.setenv("OMP_PROC_BIND", "true")
    monkeypatch.setenv("OMP_PLACES", "cores")
    monkeypatch.setenv("GOMP_CPU_AFFINITY", "0")
    candidate = tmp_path / "parallel.py"
    candidate.write_text(_PARALLEL)
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path / "cache",
        run_timeout_s=30.0,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
        threads=1,
    )
    with Judge(Path(__file__).parent / "fixtures" / "tiny_problem.py", config) as judge:
        verdict = judge.evaluate(candidate)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert "scheduling_locked" in verdict.confinement


def test_a_gpu_worker_is_started_without_the_lock_and_its_verdict_says_so() -> None:
    argv = ["kerneljudge.worker"]
    for lock, device in ((True, "cpu"), (False, "cuda:0")):
        cmd = confine.command(argv, ["/tmp"], lock_scheduling=lock)
        policy = json.loads(cmd[-3])  # ... python -P confine.py POLICY -- kerneljudge.worker
        assert policy.get("sched", False) is (lock and confine.features().scheduling)
        locked = "scheduling_locked" in confine.layers("candidate", device)
        assert locked is (lock and confine.features().scheduling)
