"""The speedup interval's bootstrap: medians drawn from order statistics against resampling.

For sample counts a verdict reaches (a fast candidate fills ``TimingConfig.max_samples``,
10,000), times the direct percentile bootstrap (``resamples`` x n indices drawn, each row's
median taken) and :func:`kerneljudge.timing.bootstrap_medians` side by side on the same
samples, and prints both 95% intervals of the speedup with the time ratio.

Run:  PYTHONPATH=src python3 benchmarks/bootstrap_cost.py [--resamples 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from kerneljudge.timing import bootstrap_medians


def direct(samples: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap medians the plain way: resample n values with replacement, take the median."""
    return np.median(samples[rng.integers(0, len(samples), (resamples, len(samples)))], axis=1)


def interval(method, base: np.ndarray, cand: np.ndarray, resamples: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    ratio = method(base, resamples, rng) / method(cand, resamples, rng)
    lo, hi = np.percentile(ratio, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(
        f"{'n':>7}{'direct ms':>12}{'order-stat ms':>15}{'ratio':>9}"
        "   intervals (direct | order-stat)"
    )
    rng = np.random.default_rng(1)
    for n in (200, 1000, 4000, 10_000):
        base = rng.lognormal(0.0, 0.05, n) * 9.0  # a host-bound eager reference, ms
        cand = rng.lognormal(0.0, 0.05, n) * 0.05  # a fused kernel, ms
        times = {}
        ints = {}
        for name, method in (("direct", direct), ("order", bootstrap_medians)):
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                ints[name] = interval(method, base, cand, args.resamples)
                best = min(best, time.perf_counter() - t0)
            times[name] = best * 1e3
        d, o = ints["direct"], ints["order"]
        print(
            f"{n:>7}{times['direct']:>12.1f}{times['order']:>15.2f}"
            f"{times['direct'] / times['order']:>9.0f}   "
            f"({d[0]:.3f}, {d[1]:.3f}) | ({o[0]:.3f}, {o[1]:.3f})"
        )


if __name__ == "__main__":
    main()
