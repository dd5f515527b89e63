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
