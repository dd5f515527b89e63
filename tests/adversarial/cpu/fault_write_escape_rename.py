# expected: runtime_error|rejected
# kind: writing outside the scratch directory (write inside, then os.rename out)
# problem: problem_cpu.py
"""Writes a file inside its scratch folder (allowed) and moves it out with os.rename, which no
"open" audit event sees. A sandbox with its own mount namespace (or a read-only view of the rest)
makes the rename fail (-> runtime_error)."""

import json
import os
import secrets

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_write_escape_rename"


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
            name = f"kj_escape_{secrets.token_hex(4)}"
            with open(name, "w") as f:  # in the scratch folder (the cwd)
                f.write("moved out of the scratch folder by a candidate\n")
            dest = os.path.join(os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv"), name)
            os.rename(name, dest)  # no try: a sandbox's refusal is the expected outcome
            _mark(files=[dest], breach=f"moved a file out of the scratch folder to {dest}")
        return F.gelu(self.linear(x))
