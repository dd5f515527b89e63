"""Peak memory of the judge (supervisor) and of its worker tree for one verdict of a large output.

The problem is elementwise (``torch.tanh(x) * 0.5`` on ``--mib`` MiB of fp32, so input and
output have that size); the candidate is the same code as ``ModelNew`` (plain PyTorch). Each
configuration runs in a fresh Python process, so that its peak is its own (``default``: one
``Judge`` verdict; ``all_sets``: every shape set with 10 trials; ``episode``: a
:class:`~kerneljudge.env.KernelEnv` episode whose one tool call is ``submit_kernel``, with the
environment's defaults for that tool: every shape set, 10 trials each, CUDA-graph replays timed
as well on a GPU):

* supervisor: ``ru_maxrss`` of the judging process minus its resident memory just before the
  :class:`~kerneljudge.Judge` (or the environment) was made (torch imported), against the
  output's bytes;
* tree: the largest sum of resident memory of the supervisor and every descendant, sampled
  every 0.1 s from ``/proc`` (a sampled peak: it can miss a short spike).

Run:  PYTHONPATH=src python3 benchmarks/supervisor_memory.py [--mib 64] [--device cpu]
      [--configs default,all_sets,episode] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROBLEM = """
import torch
import torch.nn as nn

N = {n}
SHAPE_SETS = {{"public": {{"N": {n}}}, "half": {{"N": {half}}}}}


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
"""

CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5
"""

CHILD = """
import json, resource, sys, time
from kerneljudge import Judge, JudgeConfig
from kerneljudge.timing import TimingConfig

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0

problem, candidate, device, config = sys.argv[1:5]
if config == "episode":
    from kerneljudge.env import EnvConfig, KernelEnv, ToolCall
kw = {"device": device, "baselines": ("eager",), "timing_config": TimingConfig(max_time_s=0.5)}
if config == "all_sets":
    kw.update(shape_sets=("half", "public"), trials=10)
base = rss()
t0 = time.monotonic()
if config == "episode":
    env_config = EnvConfig(device=device, baselines=("eager",), submit_time_s=0.5)
    with KernelEnv(problem, env_config) as env:
        env.reset()
        with open(candidate) as f:
            result = env.step(ToolCall("submit_kernel", {"kernel_code": f.read()}))
        verdict = result.info.verdict
    if verdict is None:  # the tool failed before judging: its observation says why
        print(json.dumps({"status": "no verdict", "reason": str(result.observation)}))
        sys.exit(0)
else:
    with Judge(problem, JudgeConfig(**kw)) as judge:
        verdict = judge.evaluate(candidate)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"status": verdict.status.value, "reason": verdict.reason,
                  "seconds": time.monotonic() - t0, "base_bytes": base, "peak_bytes": peak}))
"""


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (from /proc)."""
    total, frontier, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while frontier:
        p = frontier.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    frontier.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def run(config: str, problem: Path, candidate: Path, device: str) -> dict[str, object]:
    err_file = tempfile.TemporaryFile(mode="w+")  # a pipe could fill up and stall the child
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(problem), str(candidate), device, config],
        stdout=subprocess.PIPE,
        stderr=err_file,
        text=True,
    )
    tree_peak = 0
    while proc.poll() is None:
        tree_peak = max(tree_peak, _tree_rss(proc.pid))
        time.sleep(0.1)
    out = (proc.stdout.read() if proc.stdout else "").strip().splitlines()
    err_file.seek(0)
    err = err_file.read().strip().splitlines()
    err_file.close()
    result = (
        json.loads(out[-1])
        if out
        else {"status": f"exit {proc.returncode}", "reason": err[-1] if err else ""}
    )
    result["tree_peak_bytes"] = tree_peak
    result["config"] = config
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="input and output size (MiB)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--configs", default="default,all_sets,episode")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out_bytes = args.mib << 20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        problem, candidate = Path(tmp) / "elementwise.py", Path(tmp) / "candidate.py"
        problem.write_text(textwrap.dedent(PROBLEM.format(n=out_bytes // 4, half=out_bytes // 8)))
        candidate.write_text(textwrap.dedent(CANDIDATE))
        for config in args.configs.split(","):
            r = run(config, problem, candidate, args.device)
            rows.append(r)
            above = int(r.get("peak_bytes", 0)) - int(r.get("base_bytes", 0))
            print(
                f"{config:10s} {r['status']:14s} {float(r.get('seconds', 0)):6.1f} s  "
                f"supervisor +{above / 2**20:6.0f} MiB = {above / out_bytes:5.1f}x output  "
                f"(base {int(r.get('base_bytes', 0)) / 2**20:.0f} MiB)  "
                f"tree peak {int(r['tree_peak_bytes']) / 2**20:6.0f} MiB = "
                f"{int(r['tree_peak_bytes']) / out_bytes:5.1f}x output",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"output_bytes": out_bytes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
