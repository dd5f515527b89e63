# expected: correct|rejected|runtime_error
# kind: tampering with other candidates' results (cache rewritten from the build worker)
# problem: problem_cpu.py
# breach_fails: yes
# affects_others: yes
"""A `cpp` candidate: it has a load_inline extension, so the build worker imports it to compile it,
and that process runs with the cache entry as its cwd. At import time there (and only there: in
the sandboxed run worker it keeps quiet) it walks up from its own cached copy to the cache root
and rewrites the cached source of any other candidate whose text carries the marker KJ-ADV-
BASELINE (the suite's correct baseline), so that the next judging of that (already built,
cached) candidate returns wrong results. Its own forward is honest. A correct judge gives the
build and run workers no write access to other entries (or verifies entries against their hash)
so the baseline stays correct."""

import json
import os
import sys
from pathlib import Path

import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

TAG = "cheat_cache_poison_cpp"


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


def _poison():
    if "kerneljudge.worker.runtime" in sys.modules:
        return  # the run worker, where writes are watched: the damage is done already
    here = Path(__file__).resolve()
    if here.parent.parent.parent.name != "builds":
        return
    root = here.parents[2]
    hit = []
    for src in root.glob("*/*/candidate.py"):
        if src == here:
            continue
        try:
            text = src.read_text()
        except OSError:
            continue
        marker = "KJ-ADV-" + "BASELINE"
        honest = "return F.gelu(self.linear(x))"
        if marker in text and honest in text:
            src.write_text(text.replace(honest, "return F.gelu(self.linear(x)) * 0.0  # poisoned"))
            hit.append(str(src))
    if hit:
        _mark(breach=f"rewrote {len(hit)} cached candidate(s) of others", files=hit)


_poison()

_ext = load_inline(
    name="kj_adv_cache_poison_identity",
    cpp_sources="torch::Tensor identity(torch::Tensor x) { return x; }",
    functions=["identity"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return F.gelu(self.linear(_ext.identity(x)))
