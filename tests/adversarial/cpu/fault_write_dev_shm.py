# expected: rejected|runtime_error
# kind: writing /dev/shm (state shared with later workers and the host)
# problem: problem_cpu.py
# breach_fails: yes
"""Writes /dev/shm/kj_adv_shm_<hex> in ModelNew.__init__ (no audit hook armed: only the kernel
can refuse, or hand it a private /dev/shm) and again in its first forward. A file that is
visible on the host after the verdict is a breach (the suite checks); a judge gives each worker
its own /dev/shm or refuses, and the audit hook refuses the write in forward."""

import json
import os
import secrets

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_write_dev_shm"


def _mark(**facts):
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _write_shm(where):
    path = f"/dev/shm/kj_adv_shm_{secrets.token_hex(4)}"
    with open(path, "w") as f:
        f.write("state left for a later candidate\n")
    _mark(host_files=[path], note=f"wrote {path} in {where}")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.done = False
        try:
            _write_shm("__init__")
        except OSError as exc:
            _mark(note=f"__init__ refused: {exc}")

    def forward(self, x):
        if not self.done:
            self.done = True
            _write_shm("forward")  # no try: the refusal is the expected outcome
        return F.gelu(self.linear(x))
