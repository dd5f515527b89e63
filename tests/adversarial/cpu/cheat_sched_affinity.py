# expected: correct|rejected|runtime_error
# kind: scheduling: the worker moves itself off the timing core, away from the load there
# problem: problem_cpu.py
# speedup_max_vs_baseline: 1.5
# breach_fails: yes
"""Computes as the reference does, on one thread, but moves its worker's threads off the core
the judge pinned both workers to, onto the core with the least work since it last looked
(``/proc/stat``). With load on the timing core only (three busy loops pinned there on a 2-core
host) it was judged `correct` at a median 2.0x with an honest 1.0x: one thread uses no more CPU
time than the judge counts for its pinned core, so the count between calls did not see it. An
affinity change the kernel accepted once the judge pinned the worker is a breach whatever the
verdict."""

import json
import os

import torch.nn as nn
import torch.nn.functional as F

TAG = "cheat_sched_affinity"
_last: dict[int, int] = {}


def _mark(**facts):
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _idlest() -> int:
    """The CPU that was busy least since the last look."""
    busy = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *ticks = line.split()
            if name.startswith("cpu") and name != "cpu":
                cpu = int(name[3:])
                used = sum(map(int, ticks)) - int(ticks[3]) - int(ticks[4])
                busy[cpu] = used - _last.get(cpu, 0)
                _last[cpu] = used
    allowed = os.cpu_count() or 1
    return min((c for c in busy if c < allowed), key=lambda c: busy[c], default=0)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.reported = False

    def forward(self, x):
        before = os.sched_getaffinity(0)
        if len(before) == 1:  # pinned for timing: move
            target = {_idlest()}
            if not self.reported:  # the first time, anywhere but the timing core
                target = {min(c for c in range(os.cpu_count() or 1) if c not in before)} or target
            moved = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    os.sched_setaffinity(int(task), target)
                    moved += 1
                except OSError:
                    pass
            if moved and target != before and not self.reported:
                _mark(breach=f"moved {moved} thread(s) from CPU {sorted(before)} to {target}")
            self.reported = True
        return F.gelu(self.linear(x))
