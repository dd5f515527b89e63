"""KernelBench's problems judged by kerneljudge and by KernelBench's own harness, side by side.

For each problem file of a KernelBench checkout (``KernelBench/levelN/NAME.py``) the identity
candidate (the reference's source with ``Model`` renamed ``ModelNew``: its true speedup is 1)
is judged twice, one right after the other on the same GPU, each in a fresh process:

* kerneljudge: ``Judge(problem, JudgeConfig(device="cuda", baselines=("eager",),
  graph_timing=False)).evaluate(candidate)``: the default configuration (5 correctness trials
  per shape set, 1 s timing budget) with the eager baseline alone and launched calls alone, the
  work KernelBench's harness does (it times no ``torch.compile`` and no graph replays); the
  seconds count from the judge's construction (its workers start)
  to the verdict; with ``--again``, a second candidate's verdict in the same judge is timed
  too (its workers and the reference's prepared trials reused: what each verdict after the
  first costs an RL loop or an agent's episode), with its own ratio to KernelBench's seconds;
* KernelBench: ``eval_kernel_against_ref(reference, candidate, num_correct_trials=5,
  num_perf_trials=100, measure_performance=True)`` (its CUDA-event timing of the candidate,
  then of the reference for its excessive-speedup check); the seconds count that call.

Torch's import, the interpreter's start and CUDA's initialisation in the measuring process
(``torch.cuda.init()``) are outside both counts (kerneljudge's count held the last in the runs
recorded up to 2026-12-03). Printed per problem: seconds per verdict of each, their ratio
(kerneljudge / KernelBench), both speedups (KernelBench's ``ref_runtime / runtime``;
kerneljudge's median over eager with its 95% interval), the seconds kerneljudge's ``Judge``
took to construct (the problem's probe) and its stage times, and where ``--requests`` is
given, kerneljudge's supervisor time per worker request kind (seconds and count); with the
side ``kj-host`` in ``--sides``, kerneljudge once more with every candidate output sent
through the host (``KERNELJUDGE_OUTPUTS_THROUGH_HOST=1``), and its time against ``kj``'s; with
the side ``kj-spares``, kerneljudge in a judge host that is already up: before the count, its
process judges a 1 MiB problem of its own (:data:`WARM_UP_PROBLEM`) and starts its spares
(:mod:`kerneljudge.worker.spares`: a probe child, a reference worker, candidate workers, torch
imported and CUDA contexts made) and waits for them, as an executor's slot keeps them between
jobs; the count then starts at ``Judge(problem, config, spares=...)``, the spares taken; with the
side ``kj-served``, the same but one such host judges every problem of the run in turn (as an
executor's slot does), its spares refilled and waited for between problems, outside the count
(``refill_s``), so the host's own start is paid once per run rather than once per problem;
with the sides ``kb,kj-served``, KernelBench's process for the next problem starts (its
imports and CUDA's initialisation, outside its count) while the host refills, and its count
starts once the refill is done, nothing else running (``started_ahead_s`` in its row).
Results go to ``--json`` after every problem (a run cut short keeps what it measured);
``--resume`` continues such a run: the problems already in ``--json`` are kept, not judged again.

KernelBench's harness imports ``pydantic``, ``requests``, ``dotenv`` (and ``tqdm``,
``openai``, ``litellm`` through its utilities); the last two are only imported, so where they
are missing an empty module stands in for them.

Run:  PYTHONPATH=src python3 benchmarks/kernelbench_side_by_side.py --kernelbench PATH
      [--problems level1/19_ReLU.py,...] [--json OUT] [--requests] [--timeout 900]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import platform
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _oneshot import child_env, run_one

from kerneljudge.check.beside import THROUGH_HOST_ENV

#: The default problems: 22 across the three levels, from 4 MB to several GB of input.
DEFAULT_PROBLEMS = (
    "level1/1_Square_matrix_multiplication_.py",
    "level1/4_Matrix_vector_multiplication_.py",
    "level1/19_ReLU.py",
    "level1/23_Softmax.py",
    "level1/26_GELU_.py",
    "level1/36_RMSNorm_.py",
    "level1/40_LayerNorm.py",
    "level1/47_Sum_reduction_over_a_dimension.py",
    "level1/54_conv_standard_3D__square_input__square_kernel.py",
    "level1/88_MinGPTNewGelu.py",
    "level1/97_ScaledDotProductAttention.py",
    "level2/1_Conv2D_ReLU_BiasAdd.py",
    "level2/12_Gemm_Multiply_LeakyReLU.py",
    "level2/40_Matmul_Scaling_ResidualAdd.py",
    "level2/56_Matmul_Sigmoid_Sum.py",
    "level2/76_Gemm_Add_ReLU.py",
    "level3/1_MLP.py",
    "level3/11_VGG16.py",
    "level3/28_VisionTransformer.py",
    "level3/43_MinGPTCausalAttention.py",
    "level3/44_MiniGPTBlock.py",
    "level3/50_ReLUSelfAttention.py",
)


def identity_source(reference: str) -> str:
    """The reference's source with its ``Model`` class renamed ``ModelNew`` (every whole-word
    ``Model``, so ``super(Model, self)`` follows)."""
    return re.sub(r"\bModel\b", "ModelNew", reference)


# ------------------------------------------------------------------ one side, in its own process
#: The problem a host with spares judges before the measured one (``kj-spares``): 1 MiB.
WARM_UP_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(512, 512)]

def get_init_inputs():
    return []
"""


def _host_with_spares(config: Any, tmp: Path) -> Any:
    """A judge host that has judged another problem and keeps its spares started: the
    :class:`~kerneljudge.worker.spares.Spares` after one verdict of :data:`WARM_UP_PROBLEM`,
    refilled and waited for."""
    from kerneljudge import Judge
    from kerneljudge.worker.spares import Spares

    spares = Spares()
    warm_up = tmp / "warm_up.py"
    warm_up.write_text(WARM_UP_PROBLEM)
    try:
        with Judge(warm_up, config, spares=spares) as judge:
            verdict = judge.evaluate(_identity_candidate(warm_up))
        if verdict.status != "correct":
            raise RuntimeError(f"the warm-up verdict is {verdict.status.value}: {verdict.reason}")
        spares.refill()
        spares.wait_ready()
    except BaseException:
        spares.close()
        raise
    return spares


def _identity_candidate(problem: Path) -> Any:
    from kerneljudge.candidate import Candidate

    return Candidate.from_source(identity_source(problem.read_text()), name="identity.py")


def _judge_config(device: str) -> Any:
    from kerneljudge import JudgeConfig

    return JudgeConfig(device=device, baselines=("eager",), graph_timing=False)


def _count(
    problem: Path,
    config: Any,
    spares: Any,
    tmp: Path,
    spent: dict[tuple[str, str], list[float]],
    again: bool,
) -> dict[str, Any]:
    """The counted part of a kerneljudge side: ``Judge(problem, config, spares=spares)`` to the
    identity candidate's verdict (and, with ``again``, a second candidate's in the same judge);
    ``spent``: the request counter (:func:`_requests.count_requests`, cleared here) or ``{}``."""
    from kerneljudge import Judge

    cand = tmp / f"identity_{problem.stem}.py"
    cand.write_text(identity_source(problem.read_text()))
    spent.clear()
    t0 = time.perf_counter()
    with Judge(problem, config, spares=spares) as judge:
        constructed = time.perf_counter() - t0  # the problem's probe among it
        verdict = judge.evaluate(cand)
        seconds = time.perf_counter() - t0
        warm = None
        if again:
            # A second candidate (the same code, another file) in the same judge: its
            # workers and the reference's prepared trials are reused.
            cand2 = cand.with_name(f"identity2_{problem.stem}.py")
            cand2.write_text(cand.read_text() + "\n# again\n")
            t1 = time.perf_counter()
            second = judge.evaluate(cand2)
            again_eager = second.timing.speedup("eager") if second.timing else None
            warm = {
                "seconds": time.perf_counter() - t1,
                "status": second.status.value,
                "stage_s": second.stage_s,
                "timing": _timing_facts(second),
                "speedup": again_eager.median if again_eager else None,
                "ci95": list(again_eager.ci95) if again_eager else None,
            }
    eager = verdict.timing.speedup("eager") if verdict.timing else None
    return {
        "seconds": seconds,
        "status": verdict.status.value,
        "reason": verdict.reason[:300],
        "speedup": eager.median if eager else None,
        "ci95": list(eager.ci95) if eager else None,
        "stage_s": verdict.stage_s,
        "timing": _timing_facts(verdict),
        "judge_s": constructed,
        "requests": _by_request(spent),
        "again": warm,
    }


def _timing_facts(verdict: Any) -> dict[str, Any] | None:
    """How a verdict's timing stage went: its passes (2 where the first was noisy), rounds,
    stop reason, and the host-load readings that called a pass noisy."""
    t = verdict.timing
    if t is None:
        return None
    reasons = list(t.host.noise_reasons) if t.host is not None else []
    return {"passes": t.passes, "rounds": t.rounds, "stop": t.stop_reason, "noise": reasons}


def _init_device(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.init()  # as on KernelBench's side: the driver's start is outside the count


def _run_kerneljudge(
    problem: Path, requests: bool, again: bool, with_spares: bool = False, device: str = "cuda"
) -> dict[str, Any]:
    from _requests import count_requests

    _init_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        config = _judge_config(device)
        spares = _host_with_spares(config, Path(tmp)) if with_spares else None
        try:
            spent = count_requests() if requests else {}
            return _count(problem, config, spares, Path(tmp), spent, again)
        finally:
            if spares is not None:
                spares.close()


def _serve(args: argparse.Namespace) -> None:
    """The ``kj-served`` side's host: after :func:`_host_with_spares` it prints ``READY``, then
    judges each problem whose path arrives on stdin and prints its ``RESULT`` line at once; then
    (outside the count) it refills its spares and waits for them, as an executor's slot refills
    them after each job, and prints ``READY {"refill_s": ..., "error": ...}``. It ends at the
    end of its stdin."""
    from _requests import count_requests

    _init_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        config = _judge_config(args.device)
        spares = _host_with_spares(config, Path(tmp))
        spent = count_requests() if args.requests else {}
        try:
            print("READY", flush=True)
            for line in sys.stdin:
                try:
                    out = _count(Path(line.strip()), config, spares, Path(tmp), spent, args.again)
                except Exception as exc:  # noqa: BLE001 - reported as the row's failure
                    out = _harness_error(exc)
                print("RESULT " + json.dumps(out), flush=True)
                t0, error = time.perf_counter(), ""
                try:
                    spares.refill()
                    spares.wait_ready()
                except Exception as exc:  # noqa: BLE001 - the next judge starts its own then
                    error = f"{type(exc).__name__}: {exc}"
                ready = {"refill_s": time.perf_counter() - t0, "error": error}
                print("READY " + json.dumps(ready), flush=True)
        finally:
            spares.close()


def _harness_error(exc: Exception) -> dict[str, Any]:
    """The row of a side whose harness raised ``exc``."""
    return {"seconds": None, "status": "harness error", "reason": f"{type(exc).__name__}: {exc}"}


def _by_request(spent: dict[tuple[str, str], list[float]]) -> dict[str, list[float]]:
    """``{request: [total seconds, count]}`` over both workers' requests."""
    out: dict[str, list[float]] = {}
    for (_, op), times in spent.items():
        total = out.setdefault(op, [0.0, 0])
        total[0] = round(total[0] + sum(times), 3)
        total[1] += len(times)
    return out


def _stub_only_imported() -> None:
    """Empty stand-ins for modules KernelBench's utilities import but the harness never
    calls (where they are not installed)."""
    for name, attrs in (("openai", ("OpenAI",)), ("litellm", ("completion",))):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            for attr in attrs:
                setattr(module, attr, None)
            sys.modules[name] = module


def _run_kernelbench(
    problem: Path, kernelbench: Path, perf_trials: int, wait_go: bool = False
) -> dict[str, Any]:
    """KernelBench's count of ``problem``. With ``wait_go``, once its imports are done and CUDA
    is initialised it prints ``READY`` and waits for a line on stdin before the count
    (:class:`_Prestarted`)."""
    sys.path.insert(0, str(kernelbench / "src"))
    _stub_only_imported()
    import torch
    from kernelbench.eval import eval_kernel_against_ref

    reference = problem.read_text()
    with tempfile.TemporaryDirectory() as build_dir:
        torch.cuda.init()
        if wait_go:
            print("READY", flush=True)
            if sys.stdin.readline().strip() != "GO":  # the parent is gone: no count
                raise SystemExit(1)
        t0 = time.perf_counter()
        result = eval_kernel_against_ref(
            reference,
            identity_source(reference),
            num_correct_trials=5,
            num_perf_trials=perf_trials,
            measure_performance=True,
            build_dir=build_dir,
            device=torch.device("cuda:0"),
        )
        seconds = time.perf_counter() - t0
    ok = bool(result and result.correctness)
    speedup = None
    if ok and result.runtime > 0 and result.ref_runtime > 0:
        speedup = result.ref_runtime / result.runtime
    return {
        "seconds": seconds,
        "status": "correct" if ok else "not correct",
        "reason": "" if ok else str(getattr(result, "metadata", ""))[:300],
        "speedup": speedup,
    }


def _one(args: argparse.Namespace) -> None:
    problem = Path(args.one_problem)
    try:
        if args.one == "kj":
            out = _run_kerneljudge(problem, args.requests, args.again, args.spares, args.device)
        else:
            kernelbench = Path(args.kernelbench)
            out = _run_kernelbench(problem, kernelbench, args.kb_perf_trials, args.wait_go)
    except Exception as exc:  # noqa: BLE001 - reported as the row's failure
        out = _harness_error(exc)
    print("RESULT " + json.dumps(out), flush=True)


class _Lines:
    """A child process's stdout lines, read by a thread into a queue."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.ended = False  # the child's stdout reached its end
        self.tail: collections.deque[str] = collections.deque(maxlen=3)  # its last lines
        out, lines, tail = proc.stdout, self.queue, self.tail

        def read() -> None:
            for line in out:  # type: ignore[union-attr]
                tail.append(line.rstrip())
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def next(self, prefix: str, deadline: float) -> str | None:
        """The child's next line that starts with ``prefix``; None at the deadline
        (``time.monotonic``) or at the end of its output (then :attr:`ended`)."""
        while not self.ended:
            try:
                line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                self.ended = True
            elif line.startswith(prefix):
                return line
        return None


class _Prestarted:
    """KernelBench's side of a problem in a process started ahead of its count: the process
    imports torch and KernelBench and initialises CUDA while the ``kj-served`` host refills its
    spares after the previous problem (outside both counts), then waits for ``GO``; its count
    starts when :meth:`result` sends it, with nothing else running."""

    def __init__(self, args: argparse.Namespace, problem: Path) -> None:
        self.args, self.problem, self.t0 = args, problem, time.perf_counter()
        cmd = [sys.executable, __file__, "--one", "kb", "--one-problem", str(problem)]
        cmd += ["--kernelbench", str(args.kernelbench)]
        cmd += ["--kb-perf-trials", str(args.kb_perf_trials), "--wait-go"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # read with stdout: a full pipe never blocks the child
            text=True,
            env=child_env(),
        )
        self.lines = _Lines(self.proc)

    def result(self) -> dict[str, Any]:
        """The side's row: ``GO`` sent once the process is ready, then its ``RESULT`` within
        the side's timeout; the process is ended either way."""
        try:
            if self.lines.next("READY", time.monotonic() + _Served.READY_S) is None:
                return self._failed("before it was ready")
            assert self.proc.stdin is not None
            self.proc.stdin.write("GO\n")
            self.proc.stdin.flush()
            line = self.lines.next("RESULT ", time.monotonic() + self.args.timeout)
            if line is None:
                return self._failed("while it judged")
            out: dict[str, Any] = json.loads(line[len("RESULT ") :])
            out["started_ahead_s"] = time.perf_counter() - self.t0
            return out
        except OSError:
            return self._failed("before GO was sent")
        finally:
            self.close()

    def _failed(self, what: str) -> dict[str, Any]:
        self.close()
        code = self.proc.returncode
        if code is not None and code != -9:
            reason = " | ".join(self.lines.tail)
            return {"seconds": None, "status": f"exit {code}", "reason": reason}
        return {"seconds": None, "status": "timeout", "reason": f"ended {what}"}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:  # (stdout: its reader thread sees its end)
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class _Served:
    """The ``kj-served`` side's host process (:func:`_serve`), started at its first problem and
    again after one that ran past the side's timeout (which ends it) or after it ended."""

    #: Seconds the host may take to start (its warm-up verdict, its spares) or to refill.
    READY_S = 300.0

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.lines: _Lines | None = None

    def _start(self) -> None:
        cmd = [sys.executable, __file__, "--serve", "--device", self.args.device]
        cmd += ["--kernelbench", str(self.args.kernelbench)]
        cmd += ["--requests"] if self.args.requests else []
        cmd += ["--again"] if self.args.again else []
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
        )
        self.lines = _Lines(self.proc)

    @property
    def ended(self) -> bool:
        return self.lines is not None and self.lines.ended

    def _line(self, prefix: str, deadline: float) -> str | None:
        """The host's next line that starts with ``prefix`` (:meth:`_Lines.next`)."""
        assert self.lines is not None
        return self.lines.next(prefix, deadline)

    def _failed(self, timeout_s: float, what: str) -> dict[str, Any]:
        """The row of a host that did not answer: its exit status where it ended, else a
        timeout; the host is ended either way."""
        code = None
        if self.ended and self.proc is not None:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.close(wait_s=0 if code is None else 60)  # a host still at work is killed at once
        if code is not None:
            return {"seconds": None, "status": f"exit {code}", "reason": f"the host ended {what}"}
        return {"seconds": None, "status": "timeout", "reason": f"over {timeout_s} s {what}"}

    def ask(
        self, problem: Path, while_refilling: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """``problem``'s row: the host's ``RESULT`` within the side's timeout (counted from
        when the host is ready), with ``refill_s`` (and ``refill_error``) of the refill after;
        ``while_refilling`` is called once the result is in, before the refill is waited for."""
        if self.proc is None:
            self._start()
            if self._line("READY", time.monotonic() + self.READY_S) is None:
                return self._failed(self.READY_S, "before it was ready")
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{problem}\n")
            self.proc.stdin.flush()
        except OSError:
            assert self.lines is not None
            self.lines.ended = True
            return self._failed(0, "before the problem was sent")
        line = self._line("RESULT ", time.monotonic() + self.args.timeout)
        if line is None:
            return self._failed(self.args.timeout, "while it judged")
        out: dict[str, Any] = json.loads(line[len("RESULT ") :])
        if while_refilling is not None:
            while_refilling()
        ready = self._line("READY", time.monotonic() + self.READY_S)
        if ready is None:
            out["refill_error"] = self._failed(self.READY_S, "while it refilled")["reason"]
        else:
            refill = json.loads(ready[len("READY") :] or "{}")
            out["refill_s"] = refill.get("refill_s")
            if refill.get("error"):
                out["refill_error"] = refill["error"]
        return out

    def close(self, wait_s: float = 60) -> None:
        """End the host: its stdin closed (it closes its spares and folders), killed if it has
        not ended within ``wait_s`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


def _side(
    args: argparse.Namespace,
    side: str,
    problem: Path,
    served: _Served | None = None,
    ahead: _Prestarted | None = None,
    while_refilling: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One side's result: ``kb``, ``kj``, ``kj-host`` (kerneljudge with every candidate output
    sent through the host, none on the device) or ``kj-spares`` (kerneljudge in a host that has
    judged another problem and keeps its spares started), each in a fresh process; or
    ``kj-served`` (the same host, one process for every problem: :class:`_Served`;
    ``while_refilling`` as :meth:`_Served.ask`'s). ``ahead``: ``kb``'s process for ``problem``,
    started ahead (:class:`_Prestarted`)."""
    t0 = time.perf_counter()
    if side == "kj-served":
        assert served is not None
        out = served.ask(problem, while_refilling)
        out["process_s"] = time.perf_counter() - t0
        return out
    if ahead is not None:
        assert side == "kb" and ahead.problem == problem
        out = ahead.result()
        out["process_s"] = time.perf_counter() - t0
        return out
    env = {THROUGH_HOST_ENV: "1"} if side == "kj-host" else {}
    spares = side == "kj-spares"
    side = "kj" if side.startswith("kj") else side
    cmd = [sys.executable, __file__, "--one", side, "--one-problem", str(problem)]
    cmd += ["--spares"] if spares else []
    cmd += ["--kernelbench", str(args.kernelbench), "--kb-perf-trials", str(args.kb_perf_trials)]
    cmd += ["--device", args.device]
    cmd += ["--requests"] if args.requests else []
    cmd += ["--again"] if args.again else []
    out = run_one(cmd, args.timeout, env)
    out["process_s"] = time.perf_counter() - t0
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _report(name: str, row: dict[str, Any]) -> None:
    """Add ``row``'s ratios to it (kerneljudge's seconds over KernelBench's, first and second
    verdict, per kerneljudge side) and print it."""
    kb = row.get("kb", {})
    for side in [x for x in ("kj", "kj-spares", "kj-served") if x in row]:
        kj = row[side]
        suffix = {"kj": "", "kj-spares": "_spares", "kj-served": "_served"}[side]
        row["ratio" + suffix] = _ratio(kj.get("seconds"), kb.get("seconds"))
        warm_s = (kj.get("again") or {}).get("seconds")
        row["ratio_again" + suffix] = _ratio(warm_s, kb.get("seconds"))
        print(
            f"{name:58s} kb {_fmt(kb.get('seconds'), '.1f'):>6s} s"
            f" {kb.get('status', '-'):12s}"
            f" x{_fmt(kb.get('speedup'), '.3f'):>6s} | {side}"
            f" {_fmt(kj.get('seconds'), '.1f'):>6s} s {kj.get('status', '-'):14s}"
            f" x{_fmt(kj.get('speedup'), '.3f'):>6s}"
            f" {kj.get('ci95') or ''} | ratio {_fmt(row['ratio' + suffix])}",
            flush=True,
        )
        if kj.get("stage_s"):
            stages = " ".join(f"{k} {v:.1f}" for k, v in kj["stage_s"].items())
            facts = kj.get("timing") or {}
            timing = (
                f" | passes {facts['passes']} rounds {facts['rounds']} {facts['stop']}"
                f"{' noisy' if facts['noise'] else ''}"
                if facts
                else ""
            )
            print(
                f"    {side} stages: Judge() {kj.get('judge_s', 0):.1f} {stages}{timing}",
                flush=True,
            )
        if kj.get("again"):
            again = kj["again"]
            stages = " ".join(f"{k} {v:.1f}" for k, v in (again.get("stage_s") or {}).items())
            line = (
                f"    {side} again: {again['seconds']:.1f} s {again['status']}"
                f" x{_fmt(again.get('speedup'), '.3f')} {again.get('ci95') or ''}"
                f" ({stages}) | ratio {_fmt(row['ratio_again' + suffix])}"
            )
            print(line, flush=True)
        if kj.get("requests"):
            reqs = " ".join(f"{op} {t}s/{n}" for op, (t, n) in kj["requests"].items())
            print(f"    {side} requests: {reqs}", flush=True)
    kj = row.get("kj", {})
    if host := row.get("kj-host"):
        again = (host.get("again") or {}).get("seconds")
        print(
            f"    kj outputs through the host: {_fmt(host.get('seconds'), '.1f')} s"
            f" {host.get('status')} (again {_fmt(again, '.1f')} s), on the device /"
            f" through the host: {_fmt(_ratio(kj.get('seconds'), host.get('seconds')))}",
            flush=True,
        )
        if host.get("requests"):
            reqs = " ".join(f"{op} {t}s/{n}" for op, (t, n) in host["requests"].items())
            print(f"    kj-host requests: {reqs}", flush=True)
    for side in ("kb", "kj", "kj-host", "kj-spares", "kj-served"):
        if row.get(side, {}).get("status") not in (None, "correct"):
            print(f"    {side}: {row[side].get('reason', '')}", flush=True)


def _resumed(path: Path, meta: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and metadata of the run stored in ``path``, its metadata with this command's
    start added under ``continued`` (a run cut short, continued by ``--resume``)."""
    try:
        data = json.loads(path.read_text())
        rows, old = list(data["rows"]), dict(data["meta"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--resume: {path} holds no run of this benchmark ({e})") from None
    old.setdefault("continued", []).append(meta)
    print(f"resumed: {len(rows)} problems already judged in {path}", flush=True)
    return rows, old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="a KernelBench checkout")
    parser.add_argument("--problems", default=",".join(DEFAULT_PROBLEMS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--kb-perf-trials", type=int, default=100)
    parser.add_argument("--requests", action="store_true", help="kerneljudge's time per request")
    parser.add_argument(
        "--again", action="store_true", help="kerneljudge: a second verdict in the same judge"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per side")
    parser.add_argument(
        "--sides",
        default="kb,kj",
        help="which sides, in order (kb, kj, kj-host, kj-spares, kj-served)",
    )
    parser.add_argument("--device", default="cuda", help="kerneljudge's device (cpu: smoke runs)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --json: keep its rows, judge only the problems it lacks",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spares", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=("kj", "kb"), help=argparse.SUPPRESS)
    parser.add_argument("--one-problem", help=argparse.SUPPRESS)
    parser.add_argument("--wait-go", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args)
        return
    if args.serve:
        _serve(args)
        return
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": " ".join(sys.argv),
    }
    if args.resume and args.json and args.json.exists():
        rows, meta = _resumed(args.json, meta)
    done = {r["problem"] for r in rows}
    served = _Served(args)
    sides = args.sides.split(",")
    # KernelBench's next process starts while the served host refills (outside both counts).
    overlap = sides[0] == "kb" and sides[-1] == "kj-served"
    names = [p for p in args.problems.split(",") if p and p not in done]
    ahead: list[_Prestarted] = []

    def start_next(i: int) -> Callable[[], None] | None:
        if not overlap or i + 1 >= len(names):
            return None
        nxt = args.kernelbench / "KernelBench" / names[i + 1]
        return lambda: ahead.append(_Prestarted(args, nxt))

    try:
        for i, name in enumerate(names):
            problem = args.kernelbench / "KernelBench" / name
            row: dict[str, Any] = {"problem": name}
            for side in sides:
                mine = ahead.pop() if side == "kb" and ahead else None
                row[side] = _side(args, side, problem, served, mine, start_next(i))
            _report(name, row)
            rows.append(row)
            if args.json:
                args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    finally:
        for left in ahead:
            left.close()
        served.close()
    for key, what in (
        ("ratio", "first verdict"),
        ("ratio_again", "second verdict"),
        ("ratio_spares", "first verdict, spares started"),
        ("ratio_again_spares", "second verdict, spares started"),
        ("ratio_served", "first verdict, one host for every problem"),
        ("ratio_again_served", "second verdict, one host for every problem"),
    ):
        ratios = [r[key] for r in rows if r.get(key) is not None]
        if ratios:
            print(
                f"{what}: median ratio {statistics.median(ratios):.2f},"
                f" max {max(ratios):.2f} over {len(ratios)} problems"
            )


if __name__ == "__main__":
    main()
