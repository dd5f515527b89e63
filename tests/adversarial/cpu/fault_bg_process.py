# expected: rejected|runtime_error
# kind: child process that outlives the call (subprocess.Popen sleep)
# problem: problem_cpu.py
"""Starts `sleep 1000` on the first call and returns a correct result. The child is in the
worker's process group, so it dies with the worker; the verdict should still say the candidate
left a process behind. The suite checks after judging that the pid is gone."""

import json
import os
import subprocess

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_bg_process"


def _mark(**facts):
    """Report to run_suite.py. Written through a raw libc open(), which the worker's audit hook
    does not see, so that reporting never changes the verdict; under a real sandbox it fails
    quietly and the breach it would report did not happen."""
    path = os.path.join(os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv"), TAG + ".jsonl")
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if fd >= 0:
            os.write(fd, (json.dumps(facts) + "\n").encode())
            os.close(fd)
    except Exception:  # noqa: BLE001
        pass


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.child = None

    def forward(self, x):
        if self.child is None:
            self.child = subprocess.Popen(
                ["sleep", "1000"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _mark(pids=[self.child.pid], note="sleep 1000 started from forward")
        return F.gelu(self.linear(x))
