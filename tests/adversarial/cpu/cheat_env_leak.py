# expected: correct
# kind: reading what the judge owns: its environment variables (secrets, API keys)
# problem: problem_cpu.py
# breach_fails: yes
"""Computes honestly; on the first call it looks for the suite's canary variable (KJ_ADV_CANARY,
set in the judging process by run_suite.py) in its own environment, and lists (names only, never
values) variables that look like secrets. A judge that hands the candidate a scrubbed
environment and hides its own gives `correct` and no breach."""

import json
import os
import re

import torch.nn as nn
import torch.nn.functional as F

TAG = "cheat_env_leak"


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
        self.done = False

    def forward(self, x):
        if not self.done:
            self.done = True
            seen = []
            if "KJ_ADV_CANARY" in os.environ:
                seen.append("own environment")
            secretish = sorted(
                k for k in os.environ if re.search(r"KEY|TOKEN|SECRET|PASSW", k, re.I)
            )
            if seen:
                _mark(
                    breach="the judge's canary variable reached the candidate via "
                    + " and ".join(seen),
                    secret_like_names=secretish,
                    n_env=len(os.environ),
                )
        return F.gelu(self.linear(x))
