"""Cold build times: kerneljudge's build against a plain one, side by side.

For each candidate, two ``kerneljudge build`` processes start at the same moment, each with an
empty build cache of its own, so both run under the same machine load; the ratio is
plain / kerneljudge's default. Candidates are taken one at a time. ``--compare``:

* ``nvcc`` (default): ``KERNELJUDGE_PARALLEL_NVCC=0`` (plain nvcc, every step in turn) against
  the default (host and device front ends at once, :mod:`kerneljudge.build.parallel_nvcc`);
  default candidates: every example's ``cuda_fused.py``.
* ``pch``: ``KERNELJUDGE_PCH=0`` (every C++ compile parses ``torch/extension.h``) against the
  default with a store of shared precompiled headers (:mod:`kerneljudge.build.pch`). Before a
  candidate's pair, one more build with that store (not timed in the pair) makes the header
  variant its options need, if the store lacks it; its time is printed as ``first s``.
  Default candidates: every example's ``cpp_reference.py`` and ``cuda_fused.py``.

Run:  PYTHONPATH=src python3 benchmarks/build_times.py [CANDIDATE.py ...] [--compare nvcc|pch]
      [--rounds 1] [--json OUT]
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


def _start(candidate: Path, cache: Path, **env_vars: str) -> subprocess.Popen[str]:
    env = dict(os.environ, **env_vars)
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


MODES = {
    # --compare: (plain's variables, default's variables, column names)
    "nvcc": ({"KERNELJUDGE_PARALLEL_NVCC": "0"}, {}, ("plain nvcc s", "parallel s")),
    "pch": ({"KERNELJUDGE_PCH": "0"}, {}, ("no pch s", "shared pch s")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="*", type=Path)
    parser.add_argument("--compare", choices=sorted(MODES), default="nvcc")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = ("cuda_fused.py",) if args.compare == "nvcc" else ("cpp_reference.py", "cuda_fused.py")
    candidates = args.candidates or sorted(p for n in names for p in ROOT.glob(f"examples/*/{n}"))
    plain_env, default_env, (plain_col, default_col) = MODES[args.compare]
    rows = []
    first_col = "first s" if args.compare == "pch" else ""
    print(f"{'candidate':<44}{first_col:>9}{plain_col:>14}{default_col:>14}{'ratio':>8}")
    with tempfile.TemporaryDirectory(prefix="kj-build-times-") as tmp:
        store = Path(tmp) / "pch"
        default_env = dict(default_env, KERNELJUDGE_PCH_DIR=str(store))
        for r in range(args.rounds):
            for i, candidate in enumerate(candidates):
                first = None
                if args.compare == "pch":  # make the variant it needs (when it is not there)
                    first = _duration(
                        _start(candidate, Path(tmp) / f"{r}-{i}-first", **default_env)
                    )
                caches = [Path(tmp) / f"{r}-{i}-{mode}" for mode in ("plain", "default")]
                procs = [
                    _start(candidate, caches[0], **plain_env),
                    _start(candidate, caches[1], **default_env),
                ]
                plain, default = (_duration(p) for p in procs)
                name = f"{candidate.parent.name}/{candidate.name}"
                row = {"candidate": name, "plain_s": plain, "default_s": default}
                if first is not None:
                    row["first_s"] = first
                rows.append(row)
                shown = f"{first:>9.1f}" if first is not None else f"{'':>9}"
                print(f"{name:<44}{shown}{plain:>14.1f}{default:>14.1f}{plain / default:>7.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "compare": args.compare,
                    "rows": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
