"""A cold judge's first verdict, from its construction, against another source tree's, side by side.

Each round runs one fresh process per tree, alternately (this tree's ``src`` first, then
``--before``'s): it imports torch and kerneljudge (outside the count), constructs a ``Judge``
of a problem file (its probe runs: the file is not bundled) on ``--device`` and judges one
candidate, timing off by default (``--timing`` on). Printed per process: the seconds the
construction took, the seconds of ``evaluate``, their sum and the verdict's stages; at the end
the median sum of each tree over the rounds and their ratio (this tree / before).

The default problem is ``relu(x) * 2`` on 256 x 256 float32 with that code as the candidate:
where what a verdict costs is its fixed part (the probe, the workers' start-up).

Run:  PYTHONPATH=src python3 benchmarks/judge_start.py --before OTHER_CHECKOUT/src
      [--rounds 4] [--device cpu] [--problem FILE --candidate FILE] [--timing]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
"""

CHILD = """
import json, sys, time
import torch
from kerneljudge import Judge, JudgeConfig
problem, candidate, device, timing = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
config = JudgeConfig(device=device, baselines=("eager",), timing=timing)
t0 = time.perf_counter()
with Judge(problem, config) as judge:
    t1 = time.perf_counter()
    verdict = judge.evaluate(candidate)
    t2 = time.perf_counter()
print(json.dumps({"construct": t1 - t0, "evaluate": t2 - t1, "status": verdict.status.value,
                  "stages": verdict.stage_s}))
"""


def _one(src: str, problem: Path, candidate: Path, device: str, timing: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(problem), str(candidate), device, "1" if timing else "0"],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"PYTHONPATH={src}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
    return dict(json.loads(lines[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other tree's src folder")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--problem", type=Path, default=None)
    parser.add_argument("--candidate", type=Path, default=None)
    parser.add_argument("--timing", action="store_true", help="time the candidate too")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    with tempfile.TemporaryDirectory() as tmp:
        problem, candidate = args.problem, args.candidate
        if problem is None:
            problem, candidate = Path(tmp) / "problem.py", Path(tmp) / "candidate.py"
            problem.write_text(textwrap.dedent(PROBLEM))
            code = textwrap.dedent(PROBLEM)
            candidate.write_text(code.replace("class Model(", "class ModelNew("))
        totals: dict[str, list[float]] = {"this": [], "before": []}
        for _ in range(args.rounds):
            for name, src in (("this", here), ("before", args.before)):
                r = _one(src, problem, candidate, args.device, args.timing)
                total = r["construct"] + r["evaluate"]
                totals[name].append(total)
                stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
                print(
                    f"{name:6s} construct {r['construct']:.2f} evaluate {r['evaluate']:.2f} "
                    f"total {total:.2f} s {r['status']} ({stages})",
                    flush=True,
                )
    this, before = statistics.median(totals["this"]), statistics.median(totals["before"])
    print(f"median total: this {this:.2f} s, before {before:.2f} s, ratio {this / before:.2f}")


if __name__ == "__main__":
    main()
