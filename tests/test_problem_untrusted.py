"""A problem file is untrusted input: loading it runs in a probe child under limits, and every
failure is one line naming the file (exit status 2 from the command line)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from kerneljudge import Judge, JudgeConfig
from kerneljudge.candidate import Candidate
from kerneljudge.cli.app import app
from kerneljudge.errors import ProblemError
from kerneljudge.lint.cli import lint_command
from kerneljudge.problem import Problem

PROBLEMS = Path(__file__).parent / "fixtures" / "problems"
GOOD = Path(__file__).parent / "fixtures" / "candidates" / "good.py"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("exits_at_import.py", "exited with status 7 while importing the problem"),
        ("forward_raises.py", "the first reference call raised ValueError: the reference is"),
        ("mixed_dtype.py", "the first reference call raised RuntimeError"),
    ],
)
def test_a_failing_problem_is_one_line_naming_it(name: str, words: str) -> None:
    with pytest.raises(ProblemError) as err:
        Problem.load(PROBLEMS / name)
    text = str(err.value)
    assert "\n" not in text and text.startswith(str(PROBLEMS / name)) and words in text


def test_a_problem_asking_for_too_much_memory_is_stopped_at_its_limit() -> None:
    # 10 GiB of inputs under a 3 GiB limit: the allocation fails at once, nothing is touched.
    with pytest.raises(ProblemError) as err:
        Problem.load(PROBLEMS / "huge_inputs.py", probe_memory_bytes=3 << 30)
    assert "calling get_inputs needs more than 3.0 GiB of memory" in str(err.value)


def test_a_problem_that_hangs_is_stopped_at_its_time_limit() -> None:
    with pytest.raises(ProblemError) as err:
        Problem.load(PROBLEMS / "hangs_in_get_inputs.py", probe_timeout_s=40)
    assert "calling get_inputs did not finish within 40 s" in str(err.value)


def test_a_problem_that_leaves_a_thread_running_is_stopped_at_its_time_limit() -> None:
    """The probe child ends at once after its report, except where the problem left a thread
    that is not a daemon: the interpreter's end waits for it there, as the judge's would."""
    with pytest.raises(ProblemError) as err:
        Problem.load(PROBLEMS / "leaves_a_thread.py", probe_timeout_s=5)
    assert "did not finish within 5 s" in str(err.value)


def test_bundled_problems_are_trusted_and_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    import kerneljudge.problem.probe

    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError("a bundled problem was probed")

    monkeypatch.setattr(kerneljudge.problem.probe, "probe_problem", refuse)
    assert Problem.load("causal_gqa").name == "causal_gqa"


def test_the_cli_exits_2_with_one_line_for_a_problem_that_exits(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app,
        [
            "eval",
            str(GOOD),
            "-p",
            str(PROBLEMS / "exits_at_import.py"),
            "--cache-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "exited with status 7" in lines[0]


def test_lint_exits_2_for_a_problem_that_cannot_be_used() -> None:
    buf = io.StringIO()
    code = lint_command(
        [str(PROBLEMS / "forward_raises.py")], None, "cpu", False, Console(file=buf, width=200)
    )
    assert code == 2
    assert "the reference is broken" in buf.getvalue()


def test_a_reference_failing_on_its_own_is_a_problem_error_not_the_candidates(
    tmp_path: Path,
) -> None:
    # Not probed, so the reference worker's first run is where the problem fails.
    problem = Problem.load(PROBLEMS / "forward_raises.py", probe=False)
    cand = Candidate.from_source(
        "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        "        return x * 2\n"
    )
    config = JudgeConfig(device="cpu", cache_dir=tmp_path, timing=False, trials=1, threads=1)
    with Judge(problem, config) as judge, pytest.raises(ProblemError) as err:
        judge.evaluate(cand)
    text = str(err.value)
    assert "\n" not in text and "the reference is broken" in text
    assert "before the candidate ran" in text


def test_where_cuda_is_visible_the_probe_draws_on_the_meta_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The supervisor of a GPU judge draws no inputs: 10 GiB of them, made on the meta device,
    # pass a 3 GiB limit that stops the same draw on the CPU (the test above).
    import kerneljudge.problem.probe

    monkeypatch.setattr(kerneljudge.problem.probe, "_cuda_visible", lambda: True)
    probe = kerneljudge.problem.probe.probe_problem
    assert probe(PROBLEMS / "huge_inputs.py", memory_bytes=3 << 30, gpu_judge=True)[1]
    # A draw that needs real tensors is made on the CPU, under the same limits.
    assert probe(PROBLEMS / "needs_real_inputs.py", memory_bytes=3 << 30, gpu_judge=True)
    # Any other load draws in its own process: probed on the CPU, CUDA visible or not.
    with pytest.raises(ProblemError) as err:
        probe(PROBLEMS / "huge_inputs.py", memory_bytes=3 << 30)
    assert "calling get_inputs needs more than 3.0 GiB" in str(err.value)
    with pytest.raises(ProblemError) as err:
        probe(PROBLEMS / "exits_at_import.py", gpu_judge=True)
    assert "exited with status 7 while importing the problem" in str(err.value)


def test_a_meta_draw_has_the_shapes_of_the_real_one() -> None:
    problem = Problem.load(PROBLEMS / "huge_inputs.py", probe=False)
    (x,) = problem.make_inputs(0, "meta", on_device=True)
    assert x.is_meta and x.shape == (10 * 2**28,) and x.dtype == torch.float32
    model = problem.make_model(0, [], "meta")
    assert model(x).is_meta


def test_the_workers_started_beside_the_probe_end_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With a named device the judge starts its reference and candidate workers while the
    # problem is probed; a probe that fails ends them with it.
    import os

    from kerneljudge.worker import WorkerProcess
    from kerneljudge.worker.sandbox import child_pids

    started: list[WorkerProcess] = []
    init = WorkerProcess.__init__

    def spied(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(WorkerProcess, "__init__", spied)
    before = set(child_pids(os.getpid()))
    with pytest.raises(ProblemError):
        Judge(PROBLEMS / "exits_at_import.py", JudgeConfig(device="cpu"))
    assert sorted(w.role for w in started) == ["candidate", "reference"]
    assert not any(w.alive() for w in started)
    assert set(child_pids(os.getpid())) <= before


def test_a_judge_of_a_problem_file_hands_its_early_workers_to_the_first_verdict(
    tmp_path: Path,
) -> None:
    config = JudgeConfig(device="cpu", timing=False, cache_dir=tmp_path, trials=1)
    smoke = PROBLEMS.parent / "smoke"
    with Judge(smoke / "problem.py", config) as judge:
        early = judge.reference.early["cpu"]
        verdict = judge.evaluate(smoke / "candidate.py")
        assert verdict.status.value == "correct", verdict.reason
        (session,) = judge.reference.sessions.values()
        assert session.worker is early and not judge.reference.early


def test_an_early_reference_worker_outlives_a_session_that_fails_to_start(
    tmp_path: Path,
) -> None:
    # get_init_inputs raises for any seed but the probe's: the session's construction fails,
    # and the worker started for it stays the judge's, ended when the judge closes.
    problem = tmp_path / "init_fails.py"
    problem.write_text(
        (PROBLEMS / "huge_inputs.py")
        .read_text()
        .replace("[torch.randn(10 * 2**28)]", "[torch.randn(8)]")
        .replace(
            "def get_init_inputs():\n    return []",
            "def get_init_inputs():\n    assert torch.initial_seed() == 0, 'seeded'\n    return []",
        )
    )
    judge = Judge(problem, JudgeConfig(device="cpu", timing=False, cache_dir=tmp_path))
    early = judge.reference.early["cpu"]
    with pytest.raises(ProblemError, match="get_init_inputs"):
        judge.reference.session("cpu", "public")
    assert judge.reference.early["cpu"] is early and early.alive()
    judge.close()
    assert not early.alive()


WEIGHTED = """
import torch
import torch.nn as nn

SHAPE_SETS = {"public": {"n": 8}, "wide": {"n": 32}}
n = 8


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, 2 * n)

    def forward(self, x):
        return self.fc(x)


def get_inputs():
    return [torch.randn(4, n)]


def get_init_inputs():
    return [n]
"""


@pytest.mark.parametrize("gpu_judge", [False, True])
def test_the_probe_reports_the_weights_bytes_of_each_shape_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_judge: bool
) -> None:
    """The probe's construction (on the CPU, or on ``meta`` for a GPU judge) gives the bytes of
    the state dict per shape set, so that the judge need not construct ``Model`` again for
    them; a file changed since its probe has none."""
    import kerneljudge.problem.probe
    from kerneljudge.problem import probed_weight_bytes

    monkeypatch.setattr(kerneljudge.problem.probe, "_cuda_visible", lambda: gpu_judge)
    path = tmp_path / "weighted.py"
    path.write_text(WEIGHTED)
    problem = Problem.load(path, gpu_judge=gpu_judge)
    assert probed_weight_bytes(problem, "public") == (8 * 16 + 16) * 4
    assert probed_weight_bytes(problem, "wide") == (32 * 64 + 64) * 4
    assert probed_weight_bytes(problem.fresh(), "wide") == (32 * 64 + 64) * 4
    assert probed_weight_bytes(problem, "absent") is None
    path.write_text(WEIGHTED + "\n# changed\n")
    assert probed_weight_bytes(Problem.load(path, probe=False), "public") is None
