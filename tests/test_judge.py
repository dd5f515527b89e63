"""The judge end to end on the CPU: every status a candidate can earn, and recovery after faults."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status, TimingConfig, Verdict
from kerneljudge.candidate import Candidate
from kerneljudge.errors import DeviceError, WorkerError

CANDIDATES = Path(__file__).parent / "fixtures" / "candidates"


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    problem = Path(__file__).parent / "fixtures" / "tiny_problem.py"
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path_factory.mktemp("cache"),
        run_timeout_s=8.0,
        baselines=("eager",),
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
        threads=1,
    )
    with Judge(problem, config) as j:
        yield j


def evaluate(judge: Judge, name: str) -> Verdict:
    return judge.evaluate(CANDIDATES / name)


def test_correct_candidate_is_timed_against_eager(judge: Judge) -> None:
    v = evaluate(judge, "good.py")
    assert v.status is Status.CORRECT, v.reason
    assert v.check is not None and v.check.n_passed == 5
    for trial in v.check.trials:
        assert trial.oracle_err is not None and trial.oracle_err <= trial.oracle_bound
    assert v.timing is not None
    names = {m.name for m in v.timing.measurements}
    assert names == {"eager", "candidate"}
    s = v.timing.speedup("eager")
    assert s is not None and s.ci95[0] <= s.median <= s.ci95[1]
    assert v.timing.clock == "monotonic"
    assert v.timing.graph is None  # graph replays are a CUDA device's (graph_timing is on)
    assert v.device is not None and v.device.kind == "cpu"


def test_wrong_candidate_is_incorrect_with_mismatches(judge: Judge) -> None:
    v = evaluate(judge, "wrong.py")
    assert v.status is Status.INCORRECT
    assert v.timing is None  # only a correct candidate is timed
    bad = v.check.trials[0]
    assert not bad.passed and bad.mismatches
    m = bad.mismatches[0]
    assert m.got == pytest.approx(m.expected * 1.01, rel=1e-3, abs=1e-5)


def test_faults_give_verdicts_and_the_next_candidate_is_healthy(judge: Judge) -> None:
    expected = {
        "raises.py": (Status.RUNTIME_ERROR, "too many resources"),
        "segfault.py": (Status.RUNTIME_ERROR, "SIGSEGV"),
        "exits.py": (Status.RUNTIME_ERROR, "SystemExit"),
        "hang.py": (Status.TIMEOUT, "did not finish"),
        "breaks_harness.py": (Status.RUNTIME_ERROR, "after loading the candidate"),
    }
    for name, (status, words) in expected.items():
        v = evaluate(judge, name)
        assert v.status is status, (name, v.reason)
        assert words in v.reason, (name, v.reason)
        follow = evaluate(judge, "good.py")
        assert follow.status is Status.CORRECT, (name, follow.reason)


def test_parameters_are_matched_by_position_or_explained(judge: Judge) -> None:
    assert evaluate(judge, "renamed_params.py").status is Status.CORRECT
    v = evaluate(judge, "wrong_params.py")
    assert v.status is Status.RUNTIME_ERROR
    assert "do not line up" in v.reason and "lin.weight" in v.reason


def test_static_failures_never_start_a_build(judge: Judge) -> None:
    v = judge.evaluate(Candidate.from_source("class ModelNew(:\n    pass\n"))
    assert v.status is Status.COMPILE_ERROR and "syntax" in v.reason
    v = judge.evaluate(Candidate.from_source("import torch\n"))
    assert v.status is Status.COMPILE_ERROR and "ModelNew" in v.reason


def test_import_error_is_a_compile_error_at_its_line(judge: Judge) -> None:
    src = (
        "import torch\nimport torch.nn as nn\nx = undefined_name + 1\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    v = judge.evaluate(Candidate.from_source(src))
    assert v.status is Status.COMPILE_ERROR
    assert "NameError" in v.reason and "line 3" in v.reason


def test_allclose_mode_and_heldout_shapes(tmp_path: Path) -> None:
    problem = Path(__file__).parent / "fixtures" / "tiny_problem.py"
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path,
        tolerance="allclose",
        timing=False,
        shape_sets=("public", "heldout"),
        trials=2,
        threads=1,
    )
    with Judge(problem, config) as j:
        v = j.evaluate(CANDIDATES / "good.py")
    assert v.status is Status.CORRECT
    assert [t.shape_set for t in v.check.trials] == ["heldout", "heldout", "public", "public"]
    assert all(t.oracle_err is None and t.allclose for t in v.check.trials)


def test_gpu_backend_without_gpu_is_a_one_line_error(judge: Judge) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "ext = load_inline(name='a', cpp_sources='', cuda_sources='')\nclass ModelNew: pass\n"
    )
    with pytest.raises(DeviceError, match="CUDA GPU"):
        judge.evaluate(Candidate.from_source(src))


def test_verdict_json_round_trip(judge: Judge) -> None:
    v = evaluate(judge, "good.py")
    assert list(v.stage_s) == ["build", "worker", "reference", "load", "trials", "timing"]
    assert all(t >= 0 for t in v.stage_s.values())
    assert sum(v.stage_s.values()) <= v.duration_s + 1e-6
    again = Verdict.from_json(v.to_json())
    assert again == v
    assert again.to_json() == v.to_json()
    assert v.timing is not None and v.timing.baseline_errors == {}  # eager only: none missing


def test_a_missing_baseline_is_explained_in_the_verdict(judge: Judge) -> None:
    """A baseline that was asked for but not timed says why, in the JSON and in the table."""
    import dataclasses
    import io

    from rich.console import Console

    from kerneljudge.verdict.render import render_verdict

    v = evaluate(judge, "good.py")
    assert v.timing is not None
    why = "not timed: compile did not finish within 600 s"
    v = dataclasses.replace(
        v, timing=dataclasses.replace(v.timing, baseline_errors={"compile": why})
    )
    again = Verdict.from_json(v.to_json())
    assert again == v and again.timing is not None
    assert again.timing.baseline_errors == {"compile": why}
    out = io.StringIO()
    render_verdict(v, Console(file=out, width=200))
    assert why in out.getvalue()
    old = json.loads(v.to_json())
    del old["timing"]["baseline_errors"]
    old["schema_version"] = "1.1"  # a verdict written before the field existed still reads
    assert Verdict.from_dict(old).timing.baseline_errors == {}  # type: ignore[union-attr]


def test_mask_inputs_are_not_nudged_during_timing(tmp_path: Path) -> None:
    """A 0/1 float mask reaches every timed call unchanged: masked_binary.py raises on any
    other mask value, so one nudged mask element fails its verdict; timing must have run."""
    problem = Path(__file__).parent / "fixtures" / "masked_problem.py"
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path,
        baselines=("eager",),
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    with Judge(problem, config) as j:
        v = j.evaluate(CANDIDATES / "masked_good.py")
        binary = j.evaluate(CANDIDATES / "masked_binary.py")
    assert v.status is Status.CORRECT, v.reason
    assert binary.status is Status.CORRECT, binary.reason
    assert binary.timing is not None
    timed = {m.name: m.samples for m in binary.timing.measurements}
    assert timed.get("candidate", 0) >= 5, timed


def _correct_with_timed_calls(tmp_path: Path, problem: str, candidate: str) -> None:
    """``candidate`` on the fixture ``problem`` (CPU, two trials, eager only) is ``correct``
    and was timed (five calls or more), so every audited timed call matched."""
    config = JudgeConfig(
        device="cpu",
        cache_dir=tmp_path,
        trials=2,
        baselines=("eager",),
        threads=1,
        timing_config=TimingConfig(max_time_s=0.3, min_samples=5),
    )
    with Judge(Path(__file__).parent / "fixtures" / problem, config) as j:
        v = j.evaluate(CANDIDATES / candidate)
    assert v.status is Status.CORRECT, v.reason
    assert v.timing is not None
    timed = {m.name: m.samples for m in v.timing.measurements}
    assert timed.get("candidate", 0) >= 5, timed


def test_a_kernel_that_relies_on_triangular_inputs_is_correct_when_timed(tmp_path: Path) -> None:
    """Timed calls keep the structure of the inputs: a candidate that reads only the upper
    triangles of the problem's upper triangular inputs passes the audit of its timed calls
    (rows put in another order would have made its results differ from the reference's)."""
    _correct_with_timed_calls(tmp_path, "triangular_problem.py", "triangular_good.py")


def test_a_transposed_input_is_changed_between_timed_calls(tmp_path: Path) -> None:
    """An input laid out as a transpose is changed between timed calls like any other (it was
    copied as it was, so every timed call saw a trial's content again): a candidate that
    answers zeros to content it has seen before is right on every call."""
    _correct_with_timed_calls(tmp_path, "transposed_problem.py", "wrong_on_repeat.py")


def test_outputs_of_timed_calls_are_audited(judge: Judge) -> None:
    v = evaluate(judge, "degrades_when_timed.py")
    assert v.check is not None and v.check.passed  # the trials alone are fooled
    assert v.status is Status.INCORRECT
    assert "timed call" in v.reason


def test_reference_work_runs_beside_the_build(
    tmp_path: Path, slow_reference_problem: Callable[[float], Path]
) -> None:
    """A failed build is reported without waiting for the reference's preparation, and the
    judge stays usable: the next verdict waits for that preparation and uses it correctly."""
    problem = slow_reference_problem(2.0)
    config = JudgeConfig(
        device="cpu",
        trials=2,
        cache_dir=tmp_path / "cache",
        run_timeout_s=30.0,
        timing=False,
        threads=1,
    )
    good = Candidate.from_source(
        "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return x + x\n",
        name="double.py",
    )
    broken = Candidate.from_source(
        "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x) ->\n",
        name="broken.py",
    )
    with Judge(problem, config) as j:
        first = j.evaluate(broken)
        # The reference needs >= 8 s after its worker starts: two trials, each a 2 s forward
        # and a 2 s float64 oracle forward.
        assert first.status is Status.COMPILE_ERROR, first.reason
        assert first.duration_s < 5.0
        second = j.evaluate(good)
        assert second.status is Status.CORRECT, second.reason
        assert second.check is not None and second.check.n_passed == 2


def test_next_reference_work_is_prepared_ahead_with_a_fresh_seed(judge: Judge) -> None:
    """After a verdict the reference's part of the next one is prepared at once (fresh secret
    run seed); the next verdict of the same configuration uses it, another drops it."""
    evaluate(judge, "good.py")
    ahead = judge.reference.pending
    assert ahead is not None and ahead.key[0] == "cpu"
    v = evaluate(judge, "good.py")
    assert v.status is Status.CORRECT, v.reason
    pending = judge.reference.pending
    assert pending is not None and pending.run_seed != ahead.run_seed
    with judge.configured(trials=2):
        v = evaluate(judge, "good.py")  # another configuration: prepared afresh
    assert v.status is Status.CORRECT and v.check is not None and v.check.n_passed == 2
    fixed = judge.evaluate(CANDIDATES / "wrong.py", seed=7)
    again = judge.evaluate(CANDIDATES / "wrong.py", seed=7)
    assert fixed.check.trials[0].max_abs_err == again.check.trials[0].max_abs_err


def test_nothing_of_the_candidate_is_alive_when_its_verdict_returns(
    judge: Judge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict returns only once its candidate's worker (its whole process tree) has ended
    and been reaped: nothing the candidate started outlives its verdict (the adversarial
    suite's LEAK check reads the same right after each verdict)."""
    from kerneljudge.worker import WorkerPool

    taken: list[object] = []
    plain = WorkerPool.take

    def take(self: WorkerPool) -> object:
        worker = plain(self)
        taken.append(worker)
        return worker

    monkeypatch.setattr(WorkerPool, "take", take)
    assert evaluate(judge, "good.py").status is Status.CORRECT
    (worker,) = taken
    assert worker.proc.returncode is not None  # type: ignore[attr-defined]


def test_a_given_seed_is_never_reused_for_a_secret_one(judge: Judge) -> None:
    """Reference work left unused by a verdict (a failed build) is reused by the next one only
    when its seed was drawn in secret; a build known to have failed starts none."""
    judge.reference.settle()
    # as a cold build failing with seed=7 leaves it
    left = judge.reference.begin(judge.config, "cpu", 7, secret=False)
    assert judge.evaluate(CANDIDATES / "good.py").status is Status.CORRECT
    assert left is not None and left.dropped
    ahead = judge.reference.pending
    assert ahead is not None and ahead.secret and ahead.run_seed != 7
    broken = Candidate.from_source("class ModelNew(\n", name="broken.py")
    assert judge.evaluate(broken).status is Status.COMPILE_ERROR
    assert judge.reference.pending is ahead and not ahead.dropped  # kept for the next verdict


def test_work_ahead_waits_for_the_device_lock(tmp_path: Path) -> None:
    """Reference work prepared ahead of need does not run while someone else holds the
    device lock (another episode timing on the same device)."""
    import threading

    config = JudgeConfig(device="cpu", cache_dir=tmp_path, timing=False, threads=1)
    with Judge(Path(__file__).parent / "fixtures" / "tiny_problem.py", config) as j:
        lock = threading.Lock()
        j.device_lock = lock
        with lock:  # held from the verdict on: the work ahead it starts cannot take it
            assert j.evaluate(CANDIDATES / "good.py").status is Status.CORRECT
            ahead = j.reference.pending
            assert ahead is not None
            time.sleep(0.5)
            assert not ahead.done()
        ahead.join()
        assert ahead.done() and ahead.exception() is None


def test_a_closed_judge_starts_no_workers(tmp_path: Path) -> None:
    j = Judge(Path(__file__).parent / "fixtures" / "tiny_problem.py", JudgeConfig(device="cpu"))
    j.close()
    with pytest.raises(WorkerError, match="closed"):
        j.evaluate(CANDIDATES / "good.py")
    assert not j._pools and not j.reference.sessions


def test_a_reference_compile_that_does_not_finish_loses_only_that_baseline(
    tiny_problem: Path,
) -> None:
    """torch.compile past its time limit: the worker is replaced and eager timing goes on."""
    from kerneljudge.check.reference import ReferenceSession
    from kerneljudge.problem import Problem

    ref = ReferenceSession(Problem.load(tiny_problem), "public", "cpu", weight_seed=1, threads=1)
    try:
        problem = ref.problem
        trials = [problem.make_inputs(5), problem.make_inputs(6)]
        first = ref.request("run", 60, inputs=trials[0])
        ref.request("run", 60, inputs=trials[1])
        old_pid, old_scratch = ref.worker.proc.pid, ref.worker.scratch
        assert ref.ensure_compiled(0.05, trials, replay_timeout_s=60) is False  # dynamo > 50 ms
        assert "did not finish" in (ref.compile_error or ""), ref.compile_error
        assert ref.worker.proc.pid != old_pid and ref.worker.alive()
        assert not old_scratch.exists()  # the old worker's folder went with it
        assert ref.ensure_compiled(600) is False  # decided once
        reply = ref.request("time", 60, n=4, warmup=1, target="eager")
        assert len(reply["times_ms"]) == 4 and all(t > 0 for t in reply["times_ms"])
        assert ref.request("timed_outputs", 60)["n_sets"] == 2  # the two kept sets, once each
        again = ref.request("run", 60, inputs=problem.make_inputs(5))
        assert torch.equal(again["outputs"], first["outputs"])  # same weights in the new worker
    finally:
        ref.close()

    killed = ReferenceSession(Problem.load(tiny_problem), "public", "cpu", 1, threads=1)
    try:
        killed.request("run", 60, inputs=killed.problem.make_inputs(5))
        killed.kill()  # as a closing judge does: the compile fails and nothing is started
        assert killed.ensure_compiled(60) is False and not killed.worker.alive()
    finally:
        killed.close()


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T``), waiting up to 1 s for a signal to land."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        if state == "T" or time.monotonic() > deadline:
            return state == "T"
        time.sleep(0.01)


def test_workers_started_ahead_are_stopped_while_a_candidate_is_judged(
    judge: Judge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replacement worker that starts when a candidate takes its worker must not compete
    with that candidate's trials (nor its timing): it waits, stopped, until the verdict ends."""
    from kerneljudge.worker import process

    seen: list[tuple[str, list[bool]]] = []
    request = process.WorkerProcess.request

    def watched(self, op, timeout_s, **fields):  # type: ignore[no-untyped-def]
        if self.role == "candidate" and op in ("run", "time"):
            idle = judge._pools["cpu"]._idle
            seen.append((op, [_stopped(w.proc.pid) for w in idle]))
        return request(self, op, timeout_s, **fields)

    monkeypatch.setattr(process.WorkerProcess, "request", watched)
    v = evaluate(judge, "good.py")
    monkeypatch.setattr(process.WorkerProcess, "request", request)
    assert v.status is Status.CORRECT, v.reason
    assert {op for op, _ in seen} == {"run", "time"}
    assert all(states and all(states) for _, states in seen), seen
    idle = judge._pools["cpu"]._idle
    assert idle and not any(_stopped(w.proc.pid) for w in idle)


def test_a_judge_of_a_policy_problem_starts_workers_ready_to_record_operators(
    fresh_worker_report,
) -> None:
    """Where the trials record operators, the worker enters the recording mode at start-up
    (its first entry imports torch._dynamo, seconds that would fall in the first trial)."""
    here = Path(__file__).parent
    for problem, loaded in (
        (here / "adversarial" / "problem_cpu_policy.py", True),
        (here / "fixtures" / "tiny_problem.py", False),
    ):
        assert fresh_worker_report(problem, "cpu").startswith(f"dynamo: {loaded} ")


def test_the_reference_worker_draws_later_trials_inputs_from_their_seeds(
    tiny_problem: Path,
) -> None:
    """The first trial's inputs are sent; later trials send only their seed, and the worker
    holds exactly the inputs the problem draws from it (what the candidate is then given)."""
    from kerneljudge.check.reference import ReferenceSession
    from kerneljudge.problem import Problem

    ref = ReferenceSession(Problem.load(tiny_problem), "public", "cpu", weight_seed=1, threads=1)
    sent: list[tuple[str, set[str]]] = []
    plain = ref.worker.request

    def spy(op: str, timeout_s: float, **fields: object) -> dict:
        sent.append((op, set(fields)))
        return plain(op, timeout_s, **fields)

    ref.worker.request = spy  # type: ignore[method-assign]
    seeds = (11, 12, 13)
    try:
        held = [ref.run_trial(f"t{k}", seed, 60) for k, seed in enumerate(seeds)]
        runs = [fields for op, fields in sent if op == "run"]
        assert "inputs" in runs[0] and "seed" not in runs[0]
        assert all("seed" in f and "inputs" not in f for f in runs[1:])
        for trial, seed in zip(held, seeds):
            got = ref.held_inputs(trial.key, 60)
            want = ref.problem.make_inputs(seed)
            assert len(got) == len(want)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            assert trial.input_bytes == sum(t.numel() * t.element_size() for t in want)
    finally:
        ref.close()


def test_get_inputs_failing_in_the_reference_worker_is_the_problems_error(
    tiny_problem: Path, tmp_path: Path
) -> None:
    """A later trial's inputs are drawn in the reference worker; when the problem's
    ``get_inputs`` raises there, the judge reports the problem's error in one line."""
    from kerneljudge.check.reference import ReferenceSession
    from kerneljudge.errors import ProblemError
    from kerneljudge.problem import Problem

    path = tmp_path / "seed_13_fails.py"
    path.write_text(
        tiny_problem.read_text().replace(
            "def get_inputs():\n",
            "def get_inputs():\n"
            "    if torch.initial_seed() == 13:\n"
            "        raise ValueError('no inputs for seed 13')\n",
        )
    )
    ref = ReferenceSession(Problem.load(path), "public", "cpu", weight_seed=1, threads=1)
    try:
        ref.run_trial("t0", 11, 60)
        with pytest.raises(ProblemError, match=r"get_inputs .* raised ValueError: no inputs"):
            ref.run_trial("t1", 13, 60)
    finally:
        ref.close()
