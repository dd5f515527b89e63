# expected: rejected|runtime_error
# kind: child process that escapes the worker (subreaper off, renamed shell, setsid, orphaned)
# problem: problem_cpu.py
"""Gets a process past every in-process check: turns off the worker's child-subreaper flag with
prctl (ctypes, from ModelNew.__init__), copies /bin/sh into its scratch folder under the name
"ninja" (a compiler tool the worker lets candidates start), and has that shell start `setsid
sleep 1000` in the background and exit. The sleep is orphaned (adopted by init, not the worker),
in its own session (killing the worker's process group misses it) and not a descendant of the
worker. The suite kills it after judging if it is still alive."""

import json
import os
import shutil
import subprocess

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_bg_process_escape"


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
        # PR_SET_CHILD_SUBREAPER off. Done in __init__, which the worker runs outside the
        # sandbox's armed window (forward would be refused a ctypes lookup of prctl).
        import ctypes

        ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)

    def forward(self, x):
        if not self.done:
            self.done = True
            sh = os.path.join(os.getcwd(), "ninja")
            shutil.copyfile("/bin/sh", sh)
            os.chmod(sh, 0o755)
            out = subprocess.run(
                [sh, "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.split()
            if out:
                _mark(
                    pids=[int(out[0])],
                    note=f"sleep 1000 (pid {out[0]}) orphaned in its own session",
                )
        return F.gelu(self.linear(x))
