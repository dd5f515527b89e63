# expected: rejected|runtime_error
# kind: writing outside the scratch folder through a directory fd (os.open(name, dir_fd=fd))
# problem: problem_cpu.py
# breach_fails: yes
"""Opens /tmp as a directory fd and creates a file relative to it, once in ModelNew.__init__ (no
audit hook is armed there: only the kernel, Landlock, can refuse) and once in its first forward
(where the audit hook sees only the relative name). Either write that lands on the host is a
breach; a judge refuses both (PermissionError: runtime_error, or rejected)."""

import json
import os
import secrets

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_write_dir_fd"


def _mark(**facts):
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _write_via_dir_fd(where):
    name = f"kj_adv_dirfd_{secrets.token_hex(4)}"
    d = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d)
        os.write(fd, b"written through a directory fd\n")
        os.close(fd)
    finally:
        os.close(d)
    path = os.path.join("/tmp", name)
    _mark(host_files=[path], breach=f"wrote {path} through a directory fd in {where}")


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.done = False
        try:
            _write_via_dir_fd("__init__")
        except OSError as exc:
            _mark(note=f"__init__ refused: {exc}")

    def forward(self, x):
        if not self.done:
            self.done = True
            _write_via_dir_fd("forward")  # no try: the refusal is the expected outcome
        return F.gelu(self.linear(x))
