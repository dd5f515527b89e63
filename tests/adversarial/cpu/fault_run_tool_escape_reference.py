# expected: correct|rejected|runtime_error
# kind: a double-forked process started through a compiler-tool name that signals the reference
# problem: problem_cpu.py
# breach_fails: yes
# affects_others: yes
"""In ModelNew.__init__ writes a `build.ninja` in its scratch folder whose rule starts, in a new
session and double-forked, a shell loop that for two minutes sends SIGSTOP then SIGCONT to
every process whose command line says `--role reference` and whose parent is the worker's
parent (the judge), and runs `ninja` (a compiler tool the worker lets candidates start) on it;
then computes honestly. A confined worker neither sees the reference (a breach when the loop
signalled it) nor leaves the loop running after its verdict (the suite reports LEAK); the worker
may also reject the process it finds still running."""

import json
import os
import secrets
import shutil
import subprocess
import time

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_run_tool_escape_reference"
LOOP = """echo $$ > "$1"
end=$(( $(date +%s) + 120 ))
while [ "$(date +%s)" -lt "$end" ]; do
  for d in /proc/[0-9]*; do
    [ "$(cut -d' ' -f4 "$d/stat" 2>/dev/null)" = "$3" ] || continue  # the same judge's
    if tr '\\0' ' ' < "$d/cmdline" 2>/dev/null | grep -q -- '--role reference'; then
      kill -STOP "${d#/proc/}" 2>/dev/null && kill -CONT "${d#/proc/}" &&
        echo '{"breach": "stopped and resumed the reference"}' >> "$2"
    fi
  done
  sleep 0.05
done
"""


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


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._escape()

    def _escape(self):
        base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.getcwd()
        mark = os.path.join(base, "kj_adv", TAG + ".jsonl")
        os.makedirs(os.path.dirname(mark), exist_ok=True)
        script = os.path.join(os.getcwd(), "kj_loop.sh")
        pidfile = os.path.join(os.getcwd(), "kj_loop.pid")
        with open(script, "w") as f:
            f.write(LOOP)
        quiet = "</dev/null >/dev/null 2>&1"
        judge = os.getppid()  # the supervisor, seen from the worker
        _ninja(f"(setsid sh {script} {pidfile} {mark} {judge} {quiet} &) {quiet}")
        for _ in range(100):
            if os.path.exists(pidfile) and open(pidfile).read().strip():
                break
            time.sleep(0.05)
        try:
            pid = int(open(pidfile).read())
            _mark(note=f"double-forked loop (pid {pid}) started", pids=[pid])
        except (OSError, ValueError):
            pass

    def forward(self, x):
        return F.gelu(self.linear(x))
