"""Verdicts per minute of the local executor with 1, 2, 4 ... slots against one plain Judge.

One fixed mix of jobs on the smoke problem (``tests/fixtures/smoke``, y = 2x + 1 on 4 x 8) is
judged by each configuration in turn, side by side in one run:

* ``plain``: one :class:`~kerneljudge.judge.Judge`, one candidate at a time (build, judge);
* ``slots=N``: a :class:`~kerneljudge.executors.local.LocalExecutor` with N CPU slots (or,
  with ``--devices``, the first N of those GPUs), every job submitted at once.

The mix (``--jobs`` jobs, cycling through a fixed pattern) holds: ``--cold`` C++ candidates
whose source carries a fresh nonce, so their build is cold (a ``load_inline`` compile, 50-100 s
on a small machine); C++ candidates already in the build cache (built once before any
configuration is timed); plain-PyTorch candidates (correct); wrong ones (incorrect); crashing
ones (runtime_error); hanging ones (timeout after ``--run-timeout`` s). The C++ candidate calls
ATen ops, so the same mix runs on a CPU or a CUDA device.

Printed per configuration: wall time from the first submit to the last verdict (slot start-up
excluded; the judges' own start-up included, as for the plain judge), verdicts per minute,
each slot's busy share of that window, and the scaling efficiency
``throughput(N) / (N * throughput(1))``; the verdict statuses of every configuration must
agree (a hanging candidate aside, none of them depends on time).

With ``--jobs-per-slot K`` the work grows with the slots (weak scaling): the plain judge and one
slot judge K jobs with ``--cold`` cold builds, N slots N copies of those K jobs (the same kinds,
N x ``--cold`` cold builds), so the efficiency measures throughput with every slot fed the same
work, not how soon a fixed mix runs out (a fixed mix is bounded below by its longest job, a cold
build, however many slots share it). Take K of at least 11 with ``--cold 1`` for a mix that
holds every kind, a hanging job included. The statuses are then compared kind by kind (each
kind's statuses must be the same set as the plain judge's).

Run:  PYTHONPATH=src python3 benchmarks/throughput.py [--slots 1,2,4] [--jobs 12] [--cold 1]
      [--jobs-per-slot K] [--devices cuda:0,cuda:1] [--max-time 0.2] [--cache DIR]
      [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from kerneljudge.candidate import Candidate
from kerneljudge.executors.base import Job, JobError
from kerneljudge.executors.local import LocalExecutor
from kerneljudge.judge import Judge
from kerneljudge.judge.options import JudgeOptions

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "fixtures" / "smoke" / "problem.py"
TORCH_GOOD = (PROBLEM.parent / "candidate.py").read_text()
RET = "return torch.addcmul"
SOURCES = {
    "torch": TORCH_GOOD,
    "wrong": TORCH_GOOD.replace("2.0))", "2.0)) + 1"),
    "crash": TORCH_GOOD.replace(RET, "raise RuntimeError('boom')\n        " + RET),
    "hang": TORCH_GOOD.replace(RET, "while True:\n            pass\n        " + RET),
}
CPP = '''"""y = 2x + 1 by a C++ extension that calls ATen ops (CPU or CUDA tensors)."""
# build: {nonce}
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_ext = load_inline(
    name="kj_bench_affine_{nonce}",
    cpp_sources="torch::Tensor affine(torch::Tensor x) {{ return x * 2.0 + 1.0; }}",
    functions=["affine"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.affine(x)
'''
#: The mix's pattern, cycled to ``--jobs`` jobs (the cold builds come first).
PATTERN = ("cpp", "torch", "wrong", "crash", "torch", "cpp", "hang", "torch", "cpp", "wrong")


def _mix(jobs: int, cold: int) -> list[tuple[str, str]]:
    """(kind, source) per job: ``cold`` cold C++ builds (fresh nonces), then the pattern."""
    out = [("cold", CPP.format(nonce=secrets.token_hex(6))) for _ in range(cold)]
    for i in range(max(0, jobs - cold)):
        kind = PATTERN[i % len(PATTERN)]
        out.append((kind, CPP.format(nonce="cached") if kind == "cpp" else SOURCES[kind]))
    return out


def _weak_mix(per_slot: int, cold: int, slots: int) -> list[tuple[str, str]]:
    """``slots`` copies of the one-slot mix of ``per_slot`` jobs (``_mix(per_slot, cold)``'s
    kinds), so every slot count judges the same work per slot: the cold builds first, then each
    kind of the pattern ``slots`` times in turn."""
    one = [kind for kind, _ in _mix(per_slot, cold)]
    out = [("cold", CPP.format(nonce=secrets.token_hex(6))) for _ in range(cold * slots)]
    for kind in one[cold:]:
        for _ in range(slots):
            out.append((kind, CPP.format(nonce="cached") if kind == "cpp" else SOURCES[kind]))
    return out


def _status(result: Any) -> str:
    return result.status.value if hasattr(result, "status") else f"JobError:{result.kind}"


def _plain(mix: list[tuple[str, str]], options: JudgeOptions) -> dict[str, Any]:
    config = options.judge_config()
    started = time.monotonic()
    with Judge(PROBLEM, config) as judge:
        statuses = [
            judge.evaluate(Candidate.from_source(src, name="candidate.py")).status.value
            for _, src in mix
        ]
    wall = time.monotonic() - started
    return {"config": "plain", "slots": 1, "wall_s": wall, "statuses": statuses, "busy": {}}


def _executor(
    mix: list[tuple[str, str]], options: JudgeOptions, slots: int, devices: list[str]
) -> dict[str, Any]:
    kwargs: dict[str, Any] = (
        {"devices": devices[:slots], "cpu_slots": 0}
        if devices
        else {"devices": [], "cpu_slots": slots}
    )
    try:
        ex = LocalExecutor(**kwargs)
    except ValueError as exc:
        return {"config": f"slots={slots}", "slots": slots, "skipped": str(exc)}
    with ex:
        ex.wait_started()
        before = ex.stats()
        started = time.monotonic()
        futures = [ex.submit(Job(str(PROBLEM), src, options)) for _, src in mix]
        results: list[Any] = []
        for f in futures:
            try:
                results.append(f.result())
            except JobError as exc:
                results.append(exc)
        wall = time.monotonic() - started
        after = ex.stats()
    busy = {
        name: (share * after.uptime_s - before.busy_share.get(name, 0.0) * before.uptime_s) / wall
        for name, share in after.busy_share.items()
    }
    statuses = [_status(r) for r in results]
    return {
        "config": f"slots={slots}",
        "slots": slots,
        "wall_s": wall,
        "statuses": statuses,
        "busy": busy,
    }


def _machine() -> dict[str, Any]:
    try:
        model = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    except (OSError, StopIteration):
        model = platform.processor()
    return {
        "cpu": model,
        "cores": len(os.sched_getaffinity(0)),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slots", default="1,2,4", help="slot counts, comma-separated")
    ap.add_argument("--jobs", type=int, default=12, help="jobs in the mix")
    ap.add_argument("--cold", type=int, default=1, help="cold C++ builds per configuration")
    ap.add_argument(
        "--jobs-per-slot",
        type=int,
        default=0,
        help="weak scaling: K jobs (and --cold cold builds) per slot instead of --jobs",
    )
    ap.add_argument("--devices", default="", help="GPUs to use (cuda:0,cuda:1); default: CPU")
    ap.add_argument("--max-time", type=float, default=0.2, help="timing budget per verdict, s")
    ap.add_argument("--run-timeout", type=float, default=3.0, help="a hanging job's limit, s")
    ap.add_argument("--cache", default=str(ROOT / ".kerneljudge-cache" / "bench"))
    ap.add_argument("--no-plain", action="store_true", help="skip the plain judge")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    devices = [d for d in args.devices.split(",") if d]
    counts = [int(s) for s in args.slots.split(",") if s]
    options = JudgeOptions(
        device=("cuda" if devices else "cpu"),
        trials=2,
        timing=True,
        max_time_s=args.max_time,
        run_timeout_s=args.run_timeout,
        cache_dir=args.cache,
    )
    machine = _machine()
    print(f"machine: {machine}", flush=True)
    # The cached C++ build, before anything is timed (a compile the first time only).
    t0 = time.monotonic()
    with Judge(PROBLEM, options.judge_config()) as judge:
        judge.build(Candidate.from_source(CPP.format(nonce="cached"), name="candidate.py"))
    print(f"cached C++ build ready ({time.monotonic() - t0:.1f} s)", flush=True)
    runs: list[dict[str, Any]] = []
    configs: list[int | None] = ([] if args.no_plain else [None]) + counts
    for n in configs:
        # fresh nonces: each configuration's builds are cold
        if args.jobs_per_slot > 0:
            mix = _weak_mix(args.jobs_per_slot, args.cold, n or 1)
        else:
            mix = _mix(args.jobs, args.cold)
        run = _plain(mix, options) if n is None else _executor(mix, options, n, devices)
        run["kinds"] = [k for k, _ in mix]
        runs.append(run)
        _print_run(run)
    _summary(runs)
    if args.json:
        record = {
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": sys.argv,
            "machine": machine,
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0


def _print_run(run: dict[str, Any]) -> None:
    if "skipped" in run:
        print(f"{run['config']:>8}: skipped ({run['skipped']})", flush=True)
        return
    per_min = 60.0 * len(run["statuses"]) / run["wall_s"]
    run["verdicts_per_min"] = per_min
    busy = ", ".join(f"{k} {v:.0%}" for k, v in run["busy"].items())
    counts = dict(Counter(run["statuses"]))
    print(
        f"{run['config']:>8}: {len(run['statuses'])} verdicts in {run['wall_s']:.1f} s = "
        f"{per_min:.1f}/min; busy {busy or '-'}; {counts}",
        flush=True,
    )


def _summary(runs: list[dict[str, Any]]) -> None:
    done = [r for r in runs if "skipped" not in r]
    one = next((r for r in done if r["config"] == "slots=1"), None)
    print("\nconfig    verdicts/min  efficiency  statuses as plain")
    plain = next((r for r in done if r["config"] == "plain"), None)
    for r in done:
        eff = ""
        if one is not None and r["config"].startswith("slots="):
            r["efficiency"] = r["verdicts_per_min"] / (r["slots"] * one["verdicts_per_min"])
            eff = f"{r['efficiency']:.2f}"
        same = ""
        if plain is not None:
            mine, theirs = _by_kind(r), _by_kind(plain)
            same = "yes" if all(mine[k] == theirs[k] for k in mine.keys() & theirs.keys()) else "no"
        print(f"{r['config']:<9} {r['verdicts_per_min']:>12.1f}  {eff:>10}  {same:>8}")


def _by_kind(run: dict[str, Any]) -> dict[str, set[str]]:
    """Each kind of job's set of statuses in ``run`` (``cold`` counted as ``cpp``)."""
    out: dict[str, set[str]] = {}
    for kind, status in zip(run["kinds"], run["statuses"], strict=True):
        out.setdefault("cpp" if kind == "cold" else kind, set()).add(status)
    return out


if __name__ == "__main__":
    sys.exit(main())
