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
* ``cuda_pch``: ``KERNELJUDGE_CUDA_PCH=0`` (the host compile of a ``.cu`` file parses torch's
  headers) against the default, which compiles it through a shared prefix
  (:mod:`kerneljudge.build.pch_cuda`); the store is made first as for ``pch``. Default
  candidates: every example's ``cuda_fused.py``.
* ``kernelbench``: a whole cold verdict, kerneljudge's against KernelBench's harness. The
  candidate's problem is the bundled problem its folder is named after
  (``src/kerneljudge/problems/<folder>.py``). Each figure is one fresh process, timed from its
  start to its exit (the interpreter's start and torch's import included):

  - ``no-store s``: ``kerneljudge eval --local --json --baselines eager`` with an empty build
    cache and an empty store of precompiled headers of its own: the first candidate of a fresh
    machine, which also pays the header's build;
  - ``cold s``: the same with another empty build cache and the store shared by all candidates
    (``KERNELJUDGE_PCH_DIR``), as it is in practice; before it, a warm-up ``kerneljudge build``
    of the candidate into a throwaway cache makes the header variant its options need, if the
    store lacks it (in practice an earlier candidate with the same options made it);
  - ``warm s``: the ``cold`` command again, its build cache now filled;
  - with ``--plain-cuda-host``, ``kj_cold_plain_host`` (CUDA candidates, printed below the
    row): the ``cold`` command with another empty build cache and ``KERNELJUDGE_CUDA_PCH=0``
    (the host compile of the ``.cu`` file parses torch's headers again,
    :mod:`kerneljudge.build.pch_cuda`);
  - ``kb cold s`` (CUDA candidates only): KernelBench's ``eval_kernel_against_ref(reference,
    candidate, num_correct_trials=5, num_perf_trials=100, measure_performance=True,
    build_dir=<empty folder>)`` (its correctness trials, CUDA-event timing of the candidate,
    then of the reference for its excessive-speedup check); ``kb torch s`` and ``kb eval s``
    are that process's own ``import torch`` and the call alone.

  kerneljudge times against the eager baseline alone, by launched calls alone
  (``--baselines eager --no-graph``), the work KernelBench's harness does; its stage times
  and status come from the verdict's JSON, and
  KernelBench's status from its result (compiled, correctness, runtime in us). ``ratio``:
  ``cold`` / ``kb cold``. The bundled problems and example candidates already follow
  KernelBench's convention (the problem defines ``Model``, ``get_inputs`` and
  ``get_init_inputs``; the candidate ``ModelNew``), so both sources go to KernelBench as they
  are. KernelBench's harness imports ``pydantic``, ``requests``, ``dotenv`` and ``tqdm`` (they
  must be importable: ``PYTHONPATH``), and ``openai`` and ``litellm``, for which empty modules
  stand in where they are missing. Without a CUDA GPU only the C++ candidates run
  (``--device cpu``, kerneljudge alone) and the CUDA side is reported skipped. Default
  candidates: ``examples/causal_gqa/seed002_submission.py``, ``examples/causal_gqa/
  cuda_fused.py``, ``examples/mla_kv_projection/cuda_fused.py`` and ``examples/causal_gqa/
  cpp_reference.py``. Results go to ``--json`` after every candidate.

Run:  PYTHONPATH=src python3 benchmarks/build_times.py [CANDIDATE.py ...] [--compare nvcc|pch]
      [--rounds 1] [--json OUT]
      PYTHONPATH=src:KB/src:WHEELS python3 benchmarks/build_times.py --compare kernelbench
      --kernelbench KB [CANDIDATE.py ...] [--rounds 1] [--json OUT] [--timeout 900]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _start(
    candidate: Path, cache: Path, device: str = "cuda", **env_vars: str
) -> subprocess.Popen[str]:
    env = dict(os.environ, **env_vars)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "kerneljudge", "build", "--device", device, "--json"]
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
    "cuda_pch": ({"KERNELJUDGE_CUDA_PCH": "0"}, {}, ("plain host s", "with prefix s")),
}

# ------------------------------------------------------------------ --compare kernelbench
#: ``--compare kernelbench``'s default candidates: three CUDA ones and one C++ one.
KERNELBENCH_CANDIDATES = (
    "examples/causal_gqa/seed002_submission.py",
    "examples/causal_gqa/cuda_fused.py",
    "examples/mla_kv_projection/cuda_fused.py",
    "examples/causal_gqa/cpp_reference.py",
)


def _problem_of(candidate: Path) -> Path:
    """The bundled problem file an example candidate's folder is named after."""
    problem = ROOT / "src" / "kerneljudge" / "problems" / f"{candidate.parent.name}.py"
    if not problem.is_file():
        raise SystemExit(f"build_times.py: {candidate}: no problem file {problem}")
    return problem


def _backend_of(candidate: Path) -> str:
    """The candidate's backend as the judge detects it (``cuda``, ``cpp``, ...)."""
    from kerneljudge.candidate import Candidate

    return Candidate.from_file(candidate).backend


def _has_cuda() -> bool:
    """Whether torch sees a CUDA GPU, asked in a child process (this one keeps no CUDA state
    and no torch import that the timed processes could share)."""
    probe = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip() == "True"


def _kj_verdict(
    candidate: Path,
    problem: Path,
    device: str,
    cache: Path,
    store: Path,
    timeout_s: float,
    **extra: str,
) -> dict[str, Any]:
    """One ``kerneljudge eval --local --json`` process with build cache ``cache``, header
    store ``store`` and the variables ``extra``: its seconds from start to exit and its
    verdict's status and stage times."""
    env = dict(os.environ, KERNELJUDGE_PCH_DIR=str(store), **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "kerneljudge", "eval", "--local", "--json", "--device", device]
    cmd += [
        "--baselines",
        "eager",
        "--no-graph",
        "--problem",
        str(problem),
        "--cache-dir",
        str(cache),
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd + [str(candidate)], env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"seconds": None, "status": "timeout", "reason": f"over {timeout_s:g} s"}
    seconds = time.perf_counter() - t0
    try:
        verdict = json.loads(proc.stdout)
    except ValueError:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return {"seconds": seconds, "status": f"exit {proc.returncode}", "reason": tail}
    return {
        "seconds": seconds,
        "status": verdict.get("status"),
        "reason": str(verdict.get("reason", ""))[:300],
        "stage_s": verdict.get("stage_s") or {},
    }


def _kb_one(candidate: Path, problem: Path, kernelbench: Path, perf_trials: int) -> None:
    """In the child process: KernelBench's harness on the candidate, printed as ``RESULT``."""
    t0 = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - t0
    sys.path.insert(0, str(kernelbench / "src"))
    from kernelbench_side_by_side import _stub_only_imported

    _stub_only_imported()
    t1 = time.perf_counter()
    from kernelbench.eval import eval_kernel_against_ref  # its import initialises CUDA

    import_s = time.perf_counter() - t1
    out: dict[str, Any] = {"torch_s": torch_s, "import_s": import_s}
    with tempfile.TemporaryDirectory(prefix="kb-build-") as build_dir:
        t2 = time.perf_counter()
        try:
            result = eval_kernel_against_ref(
                problem.read_text(),
                candidate.read_text(),
                num_correct_trials=5,
                num_perf_trials=perf_trials,
                measure_performance=True,
                build_dir=build_dir,
                device=torch.device("cuda:0"),
            )
        except Exception as exc:  # noqa: BLE001 - reported as the row's failure
            out.update(status="harness error", reason=f"{type(exc).__name__}: {exc}"[:300])
            print("RESULT " + json.dumps(out), flush=True)
            return
        out["eval_s"] = time.perf_counter() - t2
    if result is None:  # KernelBench's answer to a lock or missing-file error in its build
        out.update(status="no result (KernelBench: retry)", compiled=None, correctness=None)
    else:
        status = "correct" if result.correctness else "compiled" if result.compiled else "failed"
        out.update(
            status=status,
            compiled=result.compiled,
            correctness=result.correctness,
            runtime_us=result.runtime,
            ref_runtime_us=result.ref_runtime,
            metadata={k: str(v)[:300] for k, v in result.metadata.items()},
        )
    print("RESULT " + json.dumps(out), flush=True)


def _kb_verdict(
    candidate: Path, problem: Path, kernelbench: Path, perf_trials: int, timeout_s: float
) -> dict[str, Any]:
    """KernelBench's harness in a fresh process (:func:`_kb_one`); ``seconds``: the process's
    start to exit."""
    from _oneshot import run_one

    cmd = [sys.executable, __file__, "--kb-one", str(candidate), "--kb-problem", str(problem)]
    cmd += ["--kernelbench", str(kernelbench), "--kb-perf-trials", str(perf_trials)]
    t0 = time.perf_counter()
    out = run_one(cmd, timeout_s)
    out["seconds"] = time.perf_counter() - t0 if "eval_s" in out else None
    return out


def _fmt(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.1f}"


def _kernelbench_row(
    candidate: Path, base: Path, store: Path, gpu: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One candidate's figures (see the module's docstring); ``base``: a fresh folder."""
    problem, backend = _problem_of(candidate), _backend_of(candidate)
    row: dict[str, Any] = {"candidate": f"{candidate.parent.name}/{candidate.name}"}
    row |= {"backend": backend, "problem": str(problem.relative_to(ROOT))}
    if backend != "cpp" and not gpu:
        row["skipped"] = f"a {backend} candidate, and no CUDA GPU here"
        return row
    device = "cpu" if backend == "cpp" else "cuda"
    lone, cache = base / "lone", base / "cache"
    row["kj_no_store"] = (
        None
        if args.skip_no_store
        else _kj_verdict(candidate, problem, device, lone, lone / "pch", args.timeout)
    )
    warmup = _start(candidate, base / "warmup", device, KERNELJUDGE_PCH_DIR=str(store))
    row["store_warmup_s"] = _duration(warmup)
    row["kj_cold"] = _kj_verdict(candidate, problem, device, cache, store, args.timeout)
    row["kj_warm"] = _kj_verdict(candidate, problem, device, cache, store, args.timeout)
    if args.plain_cuda_host and backend != "cpp":
        row["kj_cold_plain_host"] = _kj_verdict(
            candidate,
            problem,
            device,
            base / "plain",
            store,
            args.timeout,
            KERNELJUDGE_CUDA_PCH="0",
        )
    row["kb"] = None
    if backend != "cpp":  # KernelBench's harness runs CUDA candidates only
        row["kb"] = _kb_verdict(
            candidate, problem, args.kernelbench, args.kb_perf_trials, args.timeout
        )
    cold, kb_s = row["kj_cold"]["seconds"], (row["kb"] or {}).get("seconds")
    row["ratio"] = cold / kb_s if cold and kb_s else None
    return row


def _print_kernelbench_row(row: dict[str, Any]) -> None:
    name = row["candidate"]
    if "skipped" in row:
        print(f"{name:<44}skipped: {row['skipped']}", flush=True)
        return
    kb = row["kb"] or {}
    ratio = f"{row['ratio']:>7.2f}x" if row["ratio"] else f"{'-':>8}"
    lone = (row["kj_no_store"] or {}).get("seconds")
    print(
        f"{name:<44}{_fmt(lone, 11)}{_fmt(row['kj_cold']['seconds'], 8)}"
        f"{_fmt(row['kj_warm']['seconds'], 8)}{_fmt(kb.get('seconds'), 10)}"
        f"{_fmt(kb.get('torch_s'), 11)}{_fmt(kb.get('eval_s'), 10)}{ratio}",
        flush=True,
    )
    for key in ("kj_no_store", "kj_cold", "kj_warm", "kj_cold_plain_host"):
        side = row.get(key)
        if side is None:
            continue
        stages = " ".join(f"{k} {v:.1f}" for k, v in side.get("stage_s", {}).items())
        reason = "" if side["status"] == "correct" else f" ({side['reason']})"
        print(f"    {key}: {side['status']}{reason}; stages: {stages}", flush=True)
    print(f"    header store warm-up build: {row['store_warmup_s']:.1f} s", flush=True)
    if row["kb"] is None:
        print("    kb: not run (KernelBench's harness runs CUDA candidates only)", flush=True)
    elif "eval_s" in kb:
        print(
            f"    kb: {kb['status']}: compiled {kb['compiled']}, correctness"
            f" {kb['correctness']}, runtime {kb.get('runtime_us')} us, reference"
            f" {kb.get('ref_runtime_us')} us; import of kernelbench.eval {kb['import_s']:.1f} s",
            flush=True,
        )
    else:
        print(f"    kb: {kb['status']}: {kb.get('reason', '')}", flush=True)


def _compare_kernelbench(args: argparse.Namespace) -> None:
    if args.kernelbench is None:
        raise SystemExit("build_times.py: --compare kernelbench needs --kernelbench PATH")
    if not (args.kernelbench / "src" / "kernelbench" / "eval.py").is_file():
        raise SystemExit(
            f"build_times.py: --kernelbench {args.kernelbench}: no KernelBench checkout there"
            " (no src/kernelbench/eval.py)"
        )
    candidates = args.candidates or [ROOT / c for c in KERNELBENCH_CANDIDATES]
    gpu = _has_cuda()
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "compare": "kernelbench",
        "host": platform.node(),
        "gpu": gpu,
        "command": " ".join(sys.argv),
    }
    print(
        "kerneljudge's verdict in a fresh process, with an empty build cache: no-store s with an"
        " empty header store too (it pays the header's build), cold s with the shared header"
        " store; warm s: cold's command again; kb: KernelBench's harness, a fresh process"
    )
    if not gpu:
        print("no CUDA GPU here: the CUDA candidates (both sides) and KernelBench are skipped")
    print(
        f"{'candidate':<44}{'no-store s':>11}{'cold s':>8}{'warm s':>8}{'kb cold s':>10}"
        f"{'kb torch s':>11}{'kb eval s':>10}{'ratio':>8}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kj-build-times-") as tmp:
        store = Path(tmp) / "pch-shared"
        for r in range(args.rounds):
            for i, candidate in enumerate(candidates):
                row = {"round": r} | _kernelbench_row(
                    candidate, Path(tmp) / f"{r}-{i}", store, gpu, args
                )
                rows.append(row)
                _print_kernelbench_row(row)
                if args.json:
                    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="*", type=Path)
    parser.add_argument("--compare", choices=sorted([*MODES, "kernelbench"]), default="nvcc")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--kernelbench", type=Path, default=None, help="a KernelBench checkout (kernelbench)"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per process (kernelbench)"
    )
    parser.add_argument(
        "--skip-no-store",
        action="store_true",
        help="kernelbench: leave out the no-store verdict (the first candidate of a fresh machine)",
    )
    parser.add_argument(
        "--plain-cuda-host",
        action="store_true",
        help="kernelbench: one more cold verdict of each CUDA candidate with"
        " KERNELJUDGE_CUDA_PCH=0 (no shared prefix for its host compile)",
    )
    parser.add_argument("--kb-perf-trials", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--kb-one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kb-problem", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kb_one:  # the child process of --compare kernelbench's KernelBench side
        _kb_one(args.kb_one, args.kb_problem, args.kernelbench, args.kb_perf_trials)
        return
    if args.compare == "kernelbench":
        _compare_kernelbench(args)
        return
    names = ("cuda_fused.py",) if args.compare != "pch" else ("cpp_reference.py", "cuda_fused.py")
    candidates = args.candidates or sorted(p for n in names for p in ROOT.glob(f"examples/*/{n}"))
    plain_env, default_env, (plain_col, default_col) = MODES[args.compare]
    rows = []
    first_col = "first s" if args.compare in ("pch", "cuda_pch") else ""
    print(f"{'candidate':<44}{first_col:>9}{plain_col:>14}{default_col:>14}{'ratio':>8}")
    with tempfile.TemporaryDirectory(prefix="kj-build-times-") as tmp:
        store = Path(tmp) / "pch"
        default_env = dict(default_env, KERNELJUDGE_PCH_DIR=str(store))
        if args.compare == "cuda_pch":  # both sides' main.cpp use the shared header
            plain_env = dict(plain_env, KERNELJUDGE_PCH_DIR=str(store))
        for r in range(args.rounds):
            for i, candidate in enumerate(candidates):
                first = None
                if first_col:  # make the variant it needs (when it is not there)
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
