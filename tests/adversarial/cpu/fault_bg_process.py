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
            )
            _mark(pids=[self.child.pid], note="sleep 1000 started from forward")
        return F.gelu(self.linear(x))
