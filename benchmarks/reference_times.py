"""Eager and torch.compile times of every bundled problem's reference, with the judge's protocol.

For each problem at a shape set (default ``public``): the trusted reference worker runs one
trial, compiles the reference (``--jobs`` problems at once, so the compile times are under
that load), then eager and compiled calls are timed alternately exactly as in a verdict (fresh
nudged inputs, L2 flush, device-wide sync before the end mark), one problem at a time. Prints one
row per problem: medians with their 95% CI, compile time, and the speedup of torch.compile.

Run:  PYTHONPATH=src python3 benchmarks/reference_times.py [--problems a,b] [--shape-set public]
      [--device cuda] [--max-time 2] [--jobs 8] [--compile-timeout 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import torch

from kerneljudge.check.reference import ReferenceSession
from kerneljudge.device import describe_device, resolve_device
from kerneljudge.errors import KernelJudgeError
from kerneljudge.problem import Problem, bundled_problem_names
from kerneljudge.timing import TimingConfig, measure_alternating, speedups, summarise
from kerneljudge.worker.process import timing_cpu


def prepare(
    name: str, shape_set: str, device: str, compile_timeout_s: float
) -> tuple[ReferenceSession, float]:
    """Start the reference worker, run one trial and compile the reference (seconds it took;
    a compile past ``compile_timeout_s`` leaves the eager reference only)."""
    problem = Problem.load(name)
    ref = ReferenceSession(problem, shape_set, device, secrets.randbits(62), threads=0)
    try:
        inputs = ref.problem.make_inputs(secrets.randbits(62))
        ref.request("run", 600, inputs=inputs)
        t0 = time.perf_counter()
        ref.ensure_compiled(compile_timeout_s, [inputs])
        return ref, time.perf_counter() - t0
    except BaseException:
        ref.close()
        raise


def time_reference(
    name: str, ref: ReferenceSession, compile_s: float, device: str, max_time_s: float
) -> dict[str, object]:
    compiled = ref.compile_error is None
    try:
        if device.startswith("cuda"):
            ref.request("pin", 60, cpus=[timing_cpu()])
        flush = 2 * (describe_device(device).l2_bytes or 128 << 20) if device != "cpu" else 0

        def sampler(target: str):
            def sample(n: int, warmup: int) -> list[float]:
                reply = ref.request(
                    "time", 600, n=n, warmup=warmup, flush_bytes=flush, target=target
                )
                return [float(x) for x in reply["times_ms"]]

            return sample

        contestants = {"eager": sampler("eager")}
        if compiled:
            contestants["compile"] = sampler("compile")
        samples, _, stop = measure_alternating(contestants, TimingConfig(max_time_s=max_time_s))
    finally:
        ref.close()
    row: dict[str, object] = {
        "problem": name,
        "shape_set": ref.shape_set,
        "stop": stop,
        "compile_s": compile_s if compiled else None,
        "compile_error": ref.compile_error,
    }
    for k, v in samples.items():
        m = summarise(k, v)
        row[k] = {
            "median_ms": m.median_ms,
            "ci95_ms": m.ci95_ms,
            "iqr_ms": m.iqr_ms,
            "samples": m.samples,
        }
    if compiled:
        (s,) = speedups({"eager": samples["eager"], "candidate": samples["compile"]})
        row["compile_speedup"] = {"median": s.median, "ci95": s.ci95}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="", help="comma list (default: all bundled)")
    parser.add_argument("--shape-set", default="public")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-time", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=8, help="problems compiled at once")
    parser.add_argument(
        "--compile-timeout", type=float, default=300.0, help="seconds per torch.compile"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = resolve_device(args.device, needs_gpu=False)
    names = [p for p in args.problems.split(",") if p] or bundled_problem_names()
    rows = []
    print(f"{'problem':<28}{'eager ms':>12}{'compile ms':>12}{'compile x':>10}{'compile s':>10}")

    started = datetime.now(UTC).isoformat(timespec="seconds")

    def report(row: dict[str, object]) -> None:
        rows.append(row)
        if args.json:  # after every row: a run cut short keeps what it measured
            args.json.write_text(
                json.dumps(
                    {
                        "date": started,
                        "device": describe_device(device).name,
                        "torch": torch.__version__,
                        "shape_set": args.shape_set,
                        "rows": rows,
                    },
                    indent=2,
                )
            )
        if "error" in row:
            print(f"{row['problem']:<28} error: {row['error']}", flush=True)
            return
        eager = row["eager"]["median_ms"]  # type: ignore[index]
        comp = row.get("compile")
        print(
            f"{row['problem']:<28}{eager:>12.4f}"
            + (
                f"{comp['median_ms']:>12.4f}{row['compile_speedup']['median']:>10.2f}"  # type: ignore[index]
                f"{row['compile_s']:>10.1f}"
                if comp
                else f"{'-':>12}{'-':>10}{'-':>10}  {row.get('compile_error') or ''}"
            ),
            flush=True,
        )

    # Compiling is CPU work and runs `--jobs` problems at once; timing runs one at a time, with
    # no compile running beside it.
    for start in range(0, len(names), args.jobs):
        chunk = names[start : start + args.jobs]
        with ThreadPoolExecutor(max_workers=len(chunk)) as pool:
            futures = [
                pool.submit(prepare, n, args.shape_set, device, args.compile_timeout) for n in chunk
            ]
        for name, future in zip(chunk, futures):
            try:
                ref, compile_s = future.result()
            except KernelJudgeError as exc:
                report({"problem": name, "error": str(exc)})
                continue
            try:
                report(time_reference(name, ref, compile_s, device, args.max_time))
            except KernelJudgeError as exc:
                report({"problem": name, "error": str(exc)})


if __name__ == "__main__":
    main()
