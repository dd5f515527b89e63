"""The local executor on the CPU: slot processes, routing, faults, cancel, close.

Real slot processes judge the smoke problem (a 4 x 8 affine map) with plain-PyTorch
candidates; no timed assertion: every wait is a generous upper bound on a loaded machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kerneljudge.executors.base import Job, JobError
from kerneljudge.executors.local import LocalExecutor, core_sets, default_cpu_slots
from kerneljudge.judge import Judge
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.worker.sandbox import child_pids

SMOKE = Path(__file__).resolve().parents[1] / "fixtures" / "smoke"
SRC = Path(__file__).resolve().parents[2] / "src"
PROBLEM = str(SMOKE / "problem.py")
GOOD = (SMOKE / "candidate.py").read_text()
WRONG = GOOD.replace("2.0))", "2.0)) + 1")
RET = "return torch.addcmul"
CRASH = GOOD.replace(RET, "raise RuntimeError('boom')\n        " + RET)
HANG = GOOD.replace(RET, "while True:\n            pass\n        " + RET)
WAIT_S = 600.0


def _options(cache: Path, **changes: object) -> JudgeOptions:
    fields: dict[str, object] = {
        "device": "cpu",
        "trials": 2,
        "timing": False,
        "cache_dir": str(cache),
        "run_timeout_s": 10.0,
    }
    fields.update(changes)
    return JudgeOptions(**fields)  # type: ignore[arg-type]


#: A process that starts a local executor of one CPU slot, prints the slot's process id and
#: sleeps.
ONE_SLOT_EXECUTOR = (
    "from kerneljudge.executors.local import LocalExecutor\n"
    "ex = LocalExecutor(devices=[], cpu_slots=1)\n"
    "ex.wait_started()\n"
    "print(ex.slot_pids()['cpu:0'], flush=True)\n"
    "import time; time.sleep(600)\n"
)


def _until(what: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_core_sets_are_disjoint_and_refuse_too_many_slots() -> None:
    sets = core_sets(3, [0, 1, 2, 3, 4, 5, 6])
    assert sets == [(0, 1), (2, 3), (4, 5)]
    with pytest.raises(ValueError, match="3 slots need at least 3 CPU cores"):
        core_sets(3, [0, 1])
    assert default_cpu_slots(0, 2) == 1
    assert default_cpu_slots(0, 16) == 7
    assert default_cpu_slots(1, 16) == 6
    assert default_cpu_slots(2, 4) == 0


def test_close_ends_every_process_of_the_executor(tmp_path: Path) -> None:
    """Afterwards this process has no child that it did not have before the executor (earlier
    tests of a whole run may leave their own, e.g. a judge's pool)."""
    before = set(child_pids(os.getpid()))
    ex = LocalExecutor(devices=[], cpu_slots=1)
    ex.wait_started()
    future = ex.submit(Job(PROBLEM, HANG, _options(tmp_path, run_timeout_s=300.0)))
    slot_pid = ex.slot_pids()["cpu:0"]
    assert slot_pid is not None
    # The job is running once the slot has started its judge's workers.
    _until(lambda: len(child_pids(slot_pid)) >= 2)
    started = [slot_pid, *child_pids(slot_pid)]
    ex.close()
    with pytest.raises(JobError) as info:
        future.result(0)
    assert info.value.kind == "cancelled"
    _until(lambda: not any(_alive(p) for p in started), 60.0)
    assert [p for p in child_pids(os.getpid()) if _alive(p) and p not in before] == []
    with pytest.raises(RuntimeError, match="closed"):
        ex.submit(Job(PROBLEM, GOOD, _options(tmp_path)))
    ex.close()  # idempotent


def test_a_slot_dies_with_its_executor_process() -> None:
    """SIGKILL of the executor's process (nothing of it runs after) ends its slot's process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", ONE_SLOT_EXECUTOR], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        slot_pid = int(proc.stdout.readline())
        assert _alive(slot_pid)
    finally:
        proc.kill()
        proc.wait()
    _until(lambda: not _alive(slot_pid), 60.0)


@pytest.fixture(scope="module")
def executor() -> Iterator[LocalExecutor]:
    ex = LocalExecutor(devices=[], cpu_slots=2)
    ex.wait_started()
    yield ex
    ex.close()


def test_statuses_are_a_plain_judges(executor: LocalExecutor, tmp_path: Path) -> None:
    sources = {"good": GOOD, "wrong": WRONG, "crash": CRASH, "hang": HANG}
    options = _options(tmp_path, run_timeout_s=5.0)
    futures = {k: executor.submit(Job(PROBLEM, s, options)) for k, s in sources.items()}
    with Judge(PROBLEM, options.judge_config()) as judge:  # (while the executor judges)
        want = {k: judge.evaluate(_candidate(s)).status.value for k, s in sources.items()}
    got = {k: f.result(WAIT_S).status.value for k, f in futures.items()}
    assert got == want
    assert got == {
        "good": "correct",
        "wrong": "incorrect",
        "crash": "runtime_error",
        "hang": "timeout",
    }
    stats = executor.stats()
    assert stats.done >= 4 and set(stats.busy_share) == {"cpu:0", "cpu:1"}
    assert all(0.0 <= share <= 1.0 for share in stats.busy_share.values())


def _candidate(source: str) -> object:
    from kerneljudge.candidate import Candidate

    return Candidate.from_source(source, name="candidate.py")


def test_two_cpu_slots_judge_at_once_on_disjoint_cores(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    cores = executor.slot_cores()
    assert set(cores["cpu:0"]).isdisjoint(cores["cpu:1"]) and cores["cpu:0"] and cores["cpu:1"]
    options = _options(tmp_path, run_timeout_s=10.0)
    jobs = [Job(PROBLEM, HANG, options) for _ in range(2)]
    futures = [executor.submit(job) for job in jobs]
    # Both slots are judging at the same moment: each has its judge's workers running.
    _until(lambda: all(_judging(executor, job.job_id) for job in jobs))
    pids = executor.slot_pids()
    for name, pid in pids.items():
        assert pid is not None
        for p in [pid, *child_pids(pid)]:
            try:
                allowed = os.sched_getaffinity(p)
            except OSError:  # ended meanwhile
                continue
            assert allowed <= set(cores[name]), (name, p, allowed)
    assert [f.result(WAIT_S).status.value for f in futures] == ["timeout", "timeout"]


def _judging(executor: LocalExecutor, job_id: str) -> tuple[str, int] | None:
    """(slot, pid) of the slot judging ``job_id`` once its judge's workers are up."""
    for name, running in executor.slot_jobs().items():
        pid = executor.slot_pids()[name]
        if running == job_id and pid is not None and len(child_pids(pid)) >= 2:
            return name, pid
    return None


def test_a_killed_slot_is_replaced_and_its_job_retried(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    job = Job(PROBLEM, HANG, _options(tmp_path, run_timeout_s=6.0))
    hang = executor.submit(job)
    _until(lambda: _judging(executor, job.job_id) is not None)
    victim = _judging(executor, job.job_id)
    assert victim is not None
    os.kill(victim[1], signal.SIGKILL)
    other = executor.submit(Job(PROBLEM, GOOD, _options(tmp_path)))
    assert other.result(WAIT_S).status.value == "correct"
    assert hang.result(WAIT_S).status.value == "timeout"  # answered by the retry
    _until(lambda: executor.slot_pids()[victim[0]] not in (None, victim[1]))
    assert not _alive(victim[1])


def test_a_job_whose_slot_dies_twice_is_a_harness_error(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    job = Job(PROBLEM, HANG, _options(tmp_path, run_timeout_s=30.0))
    future = executor.submit(job)
    killed: set[int] = set()
    while len(killed) < 2:
        _until(lambda: (_judging(executor, job.job_id) or ("", 0))[1] not in (0, *killed))
        where = _judging(executor, job.job_id)
        assert where is not None
        os.kill(where[1], signal.SIGKILL)
        killed.add(where[1])
    with pytest.raises(JobError) as info:
        future.result(WAIT_S)
    assert info.value.kind == "harness"
    assert "SIGKILL" in str(info.value) and "2 times" in str(info.value)


def test_cancel_and_duplicate_job_ids(executor: LocalExecutor, tmp_path: Path) -> None:
    options = _options(tmp_path, run_timeout_s=10.0)
    hangs = [Job(PROBLEM, HANG, options) for _ in range(2)]
    busy = [executor.submit(job) for job in hangs]
    _until(lambda: set(executor.slot_jobs().values()) == {job.job_id for job in hangs})
    queued = Job(PROBLEM, GOOD, options)
    first = executor.submit(queued)
    assert executor.submit(queued) is first  # the same id while pending: the same future
    again = Job(PROBLEM, WRONG, options, job_id=queued.job_id)
    assert executor.submit(again) is first
    _until(lambda: executor.stats().queued == 1)
    assert executor.cancel(queued.job_id)
    with pytest.raises(JobError) as info:
        first.result(0)
    assert info.value.kind == "cancelled"
    assert not executor.cancel(queued.job_id)  # no longer pending
    assert not executor.cancel("no-such-job")
    assert not executor.cancel(hangs[0].job_id)  # running: it cannot be cancelled
    assert [f.result(WAIT_S).status.value for f in busy] == ["timeout", "timeout"]


def test_harness_failures_are_job_errors(executor: LocalExecutor, tmp_path: Path) -> None:
    cuda = executor.submit(Job(PROBLEM, GOOD, _options(tmp_path, device="cuda")))
    with pytest.raises(JobError) as info:
        cuda.result(WAIT_S)
    assert info.value.kind == "device" and "\n" not in str(info.value)
    with pytest.raises(JobError) as info:
        executor.judge(Job(PROBLEM, GOOD, _options(tmp_path, device="tpu")), WAIT_S)
    assert info.value.kind == "device"
    missing = executor.submit(Job(str(tmp_path / "missing.py"), GOOD, _options(tmp_path)))
    with pytest.raises(JobError) as info:
        missing.result(WAIT_S)
    assert info.value.kind == "problem" and "\n" not in str(info.value)
    # The slot that failed to load the problem still judges.
    ok = executor.submit(Job(PROBLEM, GOOD, _options(tmp_path)))
    assert ok.result(WAIT_S).status.value == "correct"


def test_a_job_goes_to_the_free_slot_whose_judge_is_warm(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    other = tmp_path / "problem_two.py"
    other.write_text(Path(PROBLEM).read_text())
    where: list[str] = []
    for _ in range(2):
        _until(lambda: executor.stats().running == 0 and not any(executor.slot_jobs().values()))
        job = Job(str(other), GOOD, _options(tmp_path))
        future = executor.submit(job)
        _until(lambda j=job, f=future: j.job_id in executor.slot_jobs().values() or f.done())
        where += [n for n, j in executor.slot_jobs().items() if j == job.job_id]
        assert future.result(WAIT_S).status.value == "correct"
    assert len(where) == 2 and where[0] == where[1]  # the second one where the first warmed up
