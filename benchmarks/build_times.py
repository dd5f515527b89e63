"""Cold build time of CUDA candidates through plain nvcc and through kerneljudge's parallel nvcc.

For each candidate, two ``kerneljudge build`` processes start at the same moment, each with an
empty build cache of its own: one with ``KERNELJUDGE_PARALLEL_NVCC=0`` (plain nvcc, every step
in turn), one with the default (host and device front ends at once, see
:mod:`kerneljudge.build.parallel_nvcc`). Running them side by side puts both under the same machine
load; the ratio is plain / parallel. Candidates are taken one at a time.

Run:  PYTHONPATH=src python3 benchmarks/build_times.py [CANDIDATE.py ...] [--rounds 1]
      [--json OUT]      (default candidates: every example's cuda_fused.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _start(candidate: Path, cache: Path, parallel: bool) -> subprocess.Popen[str]:
    env = dict(os.environ, KERNELJUDGE_PARALLEL_NVCC="1" if parallel else "0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "kerneljudge", "build", "--device", "cuda", "--json"]
        + ["--cache-dir", str(cache), str(candidate)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _duration(proc: subprocess.Popen[str]) -> float:
    out, err = proc.communicate()
    try:
        build = json.loads(out)
    except ValueError:
        raise SystemExit(f"kerneljudge build failed:\n{out}\n{err}") from None
    if not build["ok"]:
        raise SystemExit(f"the candidate did not build:\n{build['log']}")
    return float(build["duration_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    candidates = args.candidates or sorted(ROOT.glob("examples/*/cuda_fused.py"))
    rows = []
    print(f"{'candidate':<44}{'plain nvcc s':>14}{'parallel s':>12}{'plain/parallel':>16}")
    with tempfile.TemporaryDirectory(prefix="kj-build-times-") as tmp:
        for r in range(args.rounds):
            for i, candidate in enumerate(candidates):
                caches = [Path(tmp) / f"{r}-{i}-{mode}" for mode in ("plain", "parallel")]
                procs = [_start(candidate, caches[0], False), _start(candidate, caches[1], True)]
                plain, parallel = (_duration(p) for p in procs)
                name = f"{candidate.parent.name}/{candidate.name}"
                rows.append({"candidate": name, "plain_s": plain, "parallel_s": parallel})
                print(f"{name:<44}{plain:>14.1f}{parallel:>12.1f}{plain / parallel:>15.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"date": datetime.now(UTC).isoformat(timespec="seconds"), "rows": rows}, indent=2
            )
        )


if __name__ == "__main__":
    main()
