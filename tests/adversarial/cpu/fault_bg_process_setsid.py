# expected: rejected|runtime_error
# kind: child process escaping the worker's process group (setsid)
# problem: problem_cpu.py
"""Starts `sleep 1000` in a new session (setsid) on the first call, then returns a correct
result. Killing the worker's process group does not reach it: it outlives the worker unless the
judge confines the candidate (cgroup, PID namespace). The suite checks that the pid is gone after
judging, and kills it if not."""

import json
import os
import subprocess

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_bg_process_setsid"


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
                start_new_session=True,
            )
            _mark(pids=[self.child.pid], note="sleep 1000 started in a new session")
        return F.gelu(self.linear(x))
