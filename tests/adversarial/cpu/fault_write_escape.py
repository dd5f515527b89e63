# expected: runtime_error|rejected
# kind: writing outside the scratch directory
# problem: problem_cpu.py
"""Writes a file under /tmp/kj_adv (outside the worker's scratch directory and outside its cwd)
and then computes correctly. A sandbox should make the write fail (PermissionError/OSError ->
runtime_error) or the judge should reject the candidate. A "breach" is recorded when it worked."""

import json
import os
import secrets

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_write_escape"


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
        self.done = False

    def forward(self, x):
        if not self.done:
            self.done = True
            d = os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
            path = os.path.join(d, f"kj_escape_{secrets.token_hex(4)}")
            with open(path, "w") as f:  # no try: a sandbox's refusal is the expected outcome
                f.write("written by a candidate outside its scratch directory\n")
            facts = {"files": [path], "breach": f"wrote {path} (cwd {os.getcwd()})"}
            # Does the judge's own code look writable to the candidate? (checked, not written)
            import kerneljudge

            pkg = os.path.dirname(kerneljudge.__file__)
            if os.access(os.path.join(pkg, "check.py"), os.W_OK):
                facts["judge_source_writable"] = os.path.join(pkg, "check.py")
            _mark(**facts)
        return F.gelu(self.linear(x))
