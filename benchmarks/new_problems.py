"""A judge host meeting problem after problem: seconds per verdict through the local executor,
this tree against another (``--before``), side by side.

An RL trainer or a suite sends a running host (``kerneljudge serve``'s local executor) jobs on
many problems, so many jobs are a problem's first. Each round runs one fresh process per tree,
alternately (this tree's ``src`` first, then ``--before``'s): it starts a
:class:`~kerneljudge.executors.LocalExecutor` with one slot on ``--device`` and waits for it,
then judges ``--problems`` jobs one after the other, each on a problem file the host has not
seen (``relu(x) * k`` on 256 x 256 float32, ``k`` the job's number; the identity candidate),
``--gap`` seconds apart. Printed per process: each job's seconds from its submission to its
verdict, and their median without the first job (which meets a host with nothing started);
at the end the median of those medians for each tree and their ratio (this / before).

Run:  PYTHONPATH=src python3 benchmarks/new_problems.py --before OTHER_CHECKOUT/src
      [--rounds 3] [--problems 6] [--gap 0] [--device cpu] [--timing]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, tempfile, textwrap, time
from pathlib import Path
from kerneljudge.executors import Job, LocalExecutor
from kerneljudge.judge.options import JudgeOptions

count, gap, device, timing = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {k}

def get_inputs():
    return [torch.randn(256, 256)]

def get_init_inputs():
    return []
'''
gpu = device.startswith("cuda")
executor = LocalExecutor(devices=[device] if gpu else [], cpu_slots=0 if gpu else 1)
rows = []
try:
    executor.wait_started()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1, count + 1):
            problem = Path(tmp) / f"relu_times_{k}.py"
            problem.write_text(textwrap.dedent(PROBLEM.format(k=k)))
            source = problem.read_text().replace("class Model(", "class ModelNew(")
            options = JudgeOptions(device=device, timing=timing, graph_timing=False)
            t0 = time.perf_counter()
            verdict = executor.submit(Job(str(problem), source, options)).result()
            rows.append({"seconds": time.perf_counter() - t0, "status": verdict.status.value,
                         "stages": verdict.stage_s})
            time.sleep(gap)
finally:
    executor.close()
print(json.dumps(rows))
"""


def _one(src: str, args: argparse.Namespace) -> list[dict]:
    argv = [str(args.problems), str(args.gap), args.device, "1" if args.timing else "0"]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"PYTHONPATH={src}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
    return list(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other tree's src folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--problems", type=int, default=6, help="jobs per process, each new")
    parser.add_argument("--gap", type=float, default=0.0, help="seconds between jobs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timing", action="store_true", help="time the candidates too")
    args = parser.parse_args()
    if args.problems < 2:
        parser.error("--problems must be at least 2")
    here = str(Path(__file__).resolve().parents[1] / "src")
    medians: dict[str, list[float]] = {"this": [], "before": []}
    for _ in range(args.rounds):
        for name, src in (("this", here), ("before", args.before)):
            rows = _one(src, args)
            later = statistics.median(r["seconds"] for r in rows[1:])
            medians[name].append(later)
            seconds = " ".join(f"{r['seconds']:.2f}" for r in rows)
            statuses = sorted({r["status"] for r in rows})
            print(f"{name:6s} {seconds} s | after the first: median {later:.2f} s {statuses}")
            print(f"       last job's stages: {json.dumps(rows[-1]['stages'])}", flush=True)
    this, before = statistics.median(medians["this"]), statistics.median(medians["before"])
    print(
        f"median seconds per new problem after the first: this {this:.2f}, before {before:.2f},"
        f" ratio {this / before:.2f}"
    )


if __name__ == "__main__":
    main()
