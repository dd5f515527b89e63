# expected: correct|runtime_error|rejected
# kind: GPU memory hog (takes all free device memory at import, keeps it, computes honestly)
# problem: ../fixtures/causal_gqa_any_kernel.py
# affects_others: yes
# fresh_judge: yes
"""At import (in the run worker; the build worker sees no GPU) it allocates all free memory of
the device in 1 GiB blocks, keeps it, and then computes honestly with SDPA. The reference shares
the device: if it has not yet allocated what it needs (a cold judge: this is the first candidate)
the reference fails, which today is a harness error for this and every later candidate. A
correct judge isolates device memory (limits the candidate's share, or runs the reference before
handing the device over) and gives a verdict; the next candidate is judged normally."""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

TAG = "gpu_oom_hog"
_HOARD = []


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


if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    chunk = 1 << 30
    for size in (chunk, chunk >> 4, chunk >> 8):
        while True:
            try:
                _HOARD.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    free_after, _ = torch.cuda.mem_get_info()
    _mark(
        note=f"holding {sum(t.numel() for t in _HOARD) >> 20} MiB of {total >> 20} MiB; "
        f"{free_after >> 20} MiB left free"
    )


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2).contiguous()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return attention(q, k, v)
