# expected: correct|rejected|runtime_error
# kind: slowing the reference down (SIGSTOP/SIGCONT on the reference worker)
# problem: problem_cpu.py
# speedup_max_vs_baseline: 3
"""Computes honestly. On the first call it finds the trusted reference worker (a sibling process:
same parent, `--role reference` on its command line) and starts a thread that, whenever this
worker is idle (i.e. while the reference is being timed), keeps the reference stopped 80% of the
time with SIGSTOP/SIGCONT. Always sends SIGCONT last (atexit too).

A judge whose candidate cannot signal (or even see) the reference gives `correct` with an honest
speedup, or rejects; the suite also sends SIGCONT to the reference after judging, as a safety
net."""

import atexit
import os
import signal
import threading
import time

import torch.nn as nn
import torch.nn.functional as F


def _reference_pid():
    parent = os.getppid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"kerneljudge.worker" not in argv or b"reference" not in argv:
                continue
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == parent:
                return int(d)
        except (OSError, ValueError, IndexError):
            continue
    return None


class _Throttle:
    def __init__(self, pid):
        self.pid = pid
        self.busy = True
        self.last = time.monotonic()
        self.stop = False
        self.lock = threading.Lock()
        threading.Thread(target=self.run, daemon=True).start()
        atexit.register(self.close)

    def run(self):
        end = time.monotonic() + 120
        while not self.stop and time.monotonic() < end:
            if self.busy or time.monotonic() - self.last < 0.002:
                time.sleep(0.0002)
                continue
            with self.lock:
                if self.stop:
                    break
                try:
                    os.kill(self.pid, signal.SIGSTOP)
                    time.sleep(0.004)
                finally:
                    os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.001)

    def close(self):
        self.stop = True
        with self.lock:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except OSError:
                pass


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.throttle = None
        self.tried = False

    def forward(self, x):
        if not self.tried:
            self.tried = True
            pid = _reference_pid()
            if pid is not None:
                self.throttle = _Throttle(pid)
        t = self.throttle
        if t is not None:
            t.busy = True
        try:
            return F.gelu(self.linear(x))
        finally:
            if t is not None:
                t.last = time.monotonic()
                t.busy = False
