"""Seconds per verdict against the size of a problem's inputs.

Two problems, written here for each size: ``elementwise`` (``x * 0.5 + tanh(x)``) and
``reduction`` (``x.sum(-1)``), on one float32 input of ``MiB`` MiB shaped ``(rows, 4096)``;
sizes from 1 MiB doubling up to ``--max-mib`` (or the list ``--sizes``). The candidate is the
reference's own source with ``Model`` renamed ``ModelNew`` (``torch`` backend). Each verdict
runs in a fresh process:
``Judge(problem, JudgeConfig(device=..., trials=..., baselines=("eager",)))``, timing on, the
request limits derived (``run_timeout_s`` unset; ``--run-timeout`` sets them); its seconds count
from the judge's construction (its workers start) to the verdict. Printed per size: input MiB,
seconds per verdict, the verdict's stage seconds (``Verdict.stage_s``), the reference's own call
time (the eager baseline's median from the verdict's timing, ms), and the candidate request
limit the verdict used (``Verdict.limits``). Rows go to ``--json`` after every verdict (a run
cut short keeps what it measured).

Run:  PYTHONPATH=src python3 benchmarks/size_scaling.py [--device cpu] [--max-mib 256]
      [--problems elementwise,reduction] [--trials 5] [--max-time 1] [--json OUT]
      [--timeout 1800] [--sizes 1,64,1024]
On a GPU: ``--device cuda --max-mib 8192``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _oneshot import run_one

COLUMNS = 4096  # float32 columns of the input: 16 KiB a row

#: The body of each problem's ``forward``.
FORWARDS = {"elementwise": "x * 0.5 + torch.tanh(x)", "reduction": "x.sum(dim=-1)"}

PROBLEM = '''"""{kind} on a ({rows}, {columns}) float32 input ({mib} MiB)."""

import torch
import torch.nn as nn

SHAPE_SETS = {{"public": {{}}}}


class Model(nn.Module):
    def forward(self, x):
        return {forward}


def get_inputs():
    return [torch.randn({rows}, {columns})]


def get_init_inputs():
    return []
'''


def problem_source(kind: str, mib: int) -> str:
    """The problem file of ``kind`` with a float32 input of ``mib`` MiB."""
    rows = (mib << 20) // (4 * COLUMNS)
    return PROBLEM.format(kind=kind, rows=rows, columns=COLUMNS, mib=mib, forward=FORWARDS[kind])


# ------------------------------------------------------------------ one verdict, in its process
def _one(args: argparse.Namespace) -> dict[str, Any]:
    from kerneljudge import Judge, JudgeConfig, TimingConfig

    with tempfile.TemporaryDirectory() as tmp:
        source = problem_source(args.one, args.one_mib)
        problem = Path(tmp) / f"{args.one}_{args.one_mib}mib.py"
        problem.write_text(source)
        cand = Path(tmp) / f"identity_{problem.name}"
        cand.write_text(source.replace("class Model(", "class ModelNew("))
        timing = TimingConfig(max_time_s=args.max_time) if args.max_time else TimingConfig()
        config = JudgeConfig(
            device=args.device,
            trials=args.trials,
            baselines=("eager",),
            timing_config=timing,
            run_timeout_s=args.run_timeout,
        )
        t0 = time.perf_counter()
        with Judge(problem, config) as judge:
            verdict = judge.evaluate(cand)
        seconds = time.perf_counter() - t0
    eager = verdict.timing.measurement("eager") if verdict.timing else None
    limits = verdict.limits
    return {
        "seconds": seconds,
        "status": verdict.status.value,
        "reason": verdict.reason[:300],
        "stage_s": verdict.stage_s,
        "reference_ms": eager.median_ms if eager else None,
        "run_limit_s": limits.run_s.get("public") if limits else None,
        "reference_call_s": limits.reference_call_s.get("public") if limits else None,
    }


def _verdict(args: argparse.Namespace, kind: str, mib: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", kind, "--one-mib", str(mib)]
    cmd += ["--device", args.device, "--trials", str(args.trials)]
    cmd += ["--max-time", str(args.max_time)] if args.max_time else []
    cmd += ["--run-timeout", str(args.run_timeout)] if args.run_timeout else []
    return run_one(cmd, args.timeout)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--max-mib", type=int, default=256, help="largest input, MiB")
    parser.add_argument("--sizes", default=None, help="input MiB, comma-separated")
    parser.add_argument("--problems", default="elementwise,reduction")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials")
    parser.add_argument("--max-time", type=float, default=None, help="timing budget, s")
    parser.add_argument("--run-timeout", type=float, default=None, help="explicit limit, s")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per verdict")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", choices=tuple(FORWARDS), help=argparse.SUPPRESS)
    parser.add_argument("--one-mib", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        try:
            out = _one(args)
        except Exception as exc:  # noqa: BLE001 - reported as the row's failure
            out = {"seconds": None, "status": "harness error", "reason": f"{exc}"[:300]}
        print("RESULT " + json.dumps(out), flush=True)
        return
    kinds = [k for k in args.problems.split(",") if k]
    unknown = sorted(set(kinds) - set(FORWARDS))
    if unknown:
        parser.error(f"unknown problems {unknown} (use {', '.join(FORWARDS)})")
    sizes = [1 << i for i in range(max(args.max_mib, 1).bit_length()) if 1 << i <= args.max_mib]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": args.device,
        "command": " ".join(sys.argv),
    }
    rows: list[dict[str, Any]] = []
    print(f"{'problem':12s} {'MiB':>6s} {'s/verdict':>9s} {'ref ms':>9s} {'limit s':>8s}  stages")
    for kind in kinds:
        for mib in sizes:
            row = {"problem": kind, "input_mib": mib, **_verdict(args, kind, mib)}
            rows.append(row)
            stages = " ".join(f"{k} {v:.2f}" for k, v in (row.get("stage_s") or {}).items())
            print(
                f"{kind:12s} {mib:6d} {_fmt(row.get('seconds'), '.2f'):>9s}"
                f" {_fmt(row.get('reference_ms'), '.3f'):>9s}"
                f" {_fmt(row.get('run_limit_s'), '.1f'):>8s}  {stages}"
                f"{'' if row['status'] == 'correct' else '  ' + row['status'] + ': '}"
                f"{'' if row['status'] == 'correct' else row.get('reason', '')}",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
