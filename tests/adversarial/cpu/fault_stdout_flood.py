# expected: correct|runtime_error|rejected
# kind: megabytes of stdout (64 MiB) then a correct result
# problem: problem_cpu.py
"""Prints 64 MiB to stdout and 16 MiB to stderr on the first call, then computes correctly.

The verdict may be `correct` (the output is right) as long as the log the judge keeps stays
bounded; the candidate reports how many bytes its stdout file holds afterwards (a "breach" when
the judge stored more than 16 MiB of it)."""

import json
import os
import sys

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_stdout_flood"


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
        self.flooded = False

    def forward(self, x):
        if not self.flooded:
            self.flooded = True
            line = "x" * 1023 + "\n"
            for _ in range(64 * 1024):
                sys.stdout.write(line)
            for _ in range(16 * 1024):
                sys.stderr.write(line)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                stored = os.fstat(1).st_size
            except OSError:
                stored = -1
            facts = {"stdout_file_bytes": stored}
            if stored > 16 << 20:
                facts["breach"] = (
                    f"the judge stored {stored >> 20} MiB of the candidate's stdout (no cap)"
                )
            _mark(**facts)
        return F.gelu(self.linear(x))
