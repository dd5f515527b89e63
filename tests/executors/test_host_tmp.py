"""A judging host's own temporary folder (:mod:`kerneljudge.worker.host_tmp`): the sweep keeps
a folder whose owner lives and removes one whose owners all ended, never through a link; the
local executor's slots keep their judges' temporary folders in theirs, and nothing of a slot
killed mid-job, or of an executor killed outright, is left once the executor (or the next
one) has run.

Each executor here makes its folders in a temporary folder of the test's own (``TMPDIR`` and
:data:`tempfile.tempdir` for the test), so what is left there is exactly what the executor
left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.executors.base import Job
from kerneljudge.executors.local import LocalExecutor
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.worker import host_tmp
from kerneljudge.worker.host_tmp import MAKING, PREFIXES, SLOT, HostTmp, held, sweep
from kerneljudge.worker.sandbox import child_pids

from .test_local import ONE_SLOT_EXECUTOR, _until

SMOKE = Path(__file__).resolve().parents[1] / "fixtures" / "smoke"
SRC = Path(__file__).resolve().parents[2] / "src"
PROBLEM = str(SMOKE / "problem.py")
GOOD = (SMOKE / "candidate.py").read_text()
RET = "return torch.addcmul"
HANG = GOOD.replace(RET, "while True:\n            pass\n        " + RET)
WAIT_S = 600.0
#: A process that makes a slot folder in ``argv[1]``, prints its path and sleeps.
HOLDER = (
    "import sys, time\n"
    "from kerneljudge.worker.host_tmp import SLOT, HostTmp\n"
    "print(HostTmp.make(SLOT, sys.argv[1]).path, flush=True)\n"
    "time.sleep(600)\n"
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def _ended(folder: Path) -> bool:
    """Whether every holder of ``folder``'s lock has ended."""
    return not held(folder)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of the test's own, this process's (and its children's) for the test."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base


def test_no_prefix_is_a_workers_scratch_folder() -> None:
    """Caches the judge trusts may lie beneath a host folder, never beneath a ``kj-*`` one."""
    assert PREFIXES and not any(p.startswith("kj-") for p in PREFIXES)
    with pytest.raises(ValueError, match="prefix"):
        HostTmp.make("kj-slot-")


def test_sweep_keeps_a_live_owners_folder_and_removes_a_dead_ones(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, env=_env()
    )
    try:
        assert holder.stdout is not None
        theirs = Path(holder.stdout.readline().decode().strip())
        (theirs / "kj-candidate-x").mkdir()
        (theirs / "kj-candidate-x" / "out.bin").write_bytes(b"1")
        assert theirs.parent == tmp_path and theirs.name.startswith(SLOT)
        assert held(theirs)
        assert sweep(str(tmp_path)) == [] and theirs.is_dir()  # its owner lives
        # The lock is the folder's own: a cleaner that empties the folder does not free it.
        for p in sorted(theirs.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        assert sweep(str(tmp_path)) == [] and theirs.is_dir() and held(theirs)
        (theirs / "kj-candidate-x").mkdir()
    finally:
        holder.kill()
        holder.wait()
    assert sweep(str(tmp_path)) == [theirs.name]
    assert not theirs.exists()


def test_sweep_keeps_this_process_folder_until_it_lets_go(tmp_path: Path) -> None:
    mine = HostTmp.make(SLOT, str(tmp_path))
    assert sweep(str(tmp_path)) == [] and mine.path.is_dir()
    mine.release()  # (as if this process had ended)
    assert sweep(str(tmp_path)) == [mine.path.name] and not mine.path.exists()


def test_sweep_follows_no_link_and_leaves_other_names(tmp_path: Path) -> None:
    """A link named like a host folder, to a folder whose owner ended, is left, and so is its
    target; so are folders of other names and a young folder still being made."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dead = HostTmp.make(SLOT, str(elsewhere))
    dead.release()
    base = tmp_path / "base"
    base.mkdir()
    link = base / f"{SLOT}link"
    link.symlink_to(dead.path)
    other = base / "kj-candidate-abc"
    other.mkdir()
    young = base / f"{MAKING}young"
    young.mkdir()
    fifo = base / f"{SLOT}fifo"
    os.mkfifo(fifo)
    assert sweep(str(base)) == []
    assert link.is_symlink() and dead.path.is_dir() and not held(dead.path)
    assert other.is_dir() and young.is_dir() and fifo.exists()
    old = time.time() - host_tmp.UNLOCKED_GRACE_S - 60
    os.utime(young, (old, old))
    assert sweep(str(base)) == [young.name] and link.is_symlink() and dead.path.is_dir()


def test_owner_rights_go_to_the_folder_itself_never_through_a_link(tmp_path: Path) -> None:
    """A folder closed to everyone gets its owner's rights back; a link of that name is refused
    and what it points to keeps its mode."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o000)
    closed.chmod(0o000)
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o500)
    (tmp_path / "link").symlink_to(target)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        host_tmp._owner_rwx(parent, "closed")
        with pytest.raises(OSError):
            host_tmp._owner_rwx(parent, "link")
    finally:
        os.close(parent)
    assert closed.stat().st_mode & 0o777 == 0o700
    assert target.stat().st_mode & 0o777 == 0o500


def test_remove_takes_a_tree_with_folders_closed_to_their_owner() -> None:
    """Folders a candidate closed (mode 0500, 0000) are no obstacle; the lock is let go. Run
    as an ordinary user (root reads and writes any folder whatever its mode)."""
    base = Path(tempfile.mkdtemp(prefix="host-tmp-test-", dir="/tmp"))
    base.chmod(0o777)

    def body() -> bool:
        tmp = HostTmp.make(SLOT, str(base))
        closed = tmp.path / "kj-candidate-x" / "sub"
        closed.mkdir(parents=True)
        (closed / "file").write_bytes(b"x")
        closed.chmod(0o000)
        closed.parent.chmod(0o500)
        gone = tmp.remove(timeout_s=2.0)
        return gone and not tmp.path.exists() and tmp.lock_fd == -1 and tmp.remove()

    try:
        if os.getuid() != 0:
            assert body()
            return
        pid = os.fork()
        if pid == 0:  # the child: nobody, then the removal
            code = 2
            try:
                os.setgid(65534)
                os.setuid(65534)
                code = 0 if body() else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.listdir(base) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _options(cache: Path, run_timeout_s: float) -> JudgeOptions:
    return JudgeOptions(
        device="cpu", trials=2, timing=False, cache_dir=str(cache), run_timeout_s=run_timeout_s
    )


def test_a_slot_killed_mid_job_leaves_no_folder(private_tmp: Path, tmp_path: Path) -> None:
    """The slot's judges make their temporary folders in the slot's own; after a SIGKILL of the
    slot while it judges, the job is answered by the retry and, once the executor is closed,
    nothing the executor or its slots made is left in the temporary folder."""
    ex = LocalExecutor(devices=[], cpu_slots=1)
    try:
        ex.wait_started()
        job = Job(PROBLEM, HANG, _options(tmp_path / "cache", 4.0))
        future = ex.submit(job)
        first = ex.slot_pids()["cpu:0"]
        assert first is not None
        _until(lambda: ex.slot_jobs()["cpu:0"] == job.job_id and len(child_pids(first)) >= 2)
        slots = [p for p in private_tmp.iterdir() if p.name.startswith(SLOT)]
        assert len(slots) == 1, sorted(os.listdir(private_tmp))
        _until(lambda: any(p.name.startswith("kj-candidate-") for p in slots[0].iterdir()))
        # Nothing of the judge's lies beside the slot's folder.
        assert not [n for n in os.listdir(private_tmp) if n.startswith("kj-")]
        os.kill(first, signal.SIGKILL)
        assert future.result(WAIT_S).status.value == "timeout"  # answered by the retry
        assert ex.slot_pids()["cpu:0"] not in (None, first)
        _until(lambda: not slots[0].exists(), 60.0)  # removed once the slot's death was seen
    finally:
        ex.close()
    assert sorted(os.listdir(private_tmp)) == []


def test_the_next_executor_sweeps_what_a_killed_one_left(private_tmp: Path) -> None:
    """SIGKILL of an executor's process (its slot dies with it) leaves its folders; the next
    executor's start removes them (their locks are free)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ONE_SLOT_EXECUTOR], stdout=subprocess.PIPE, env=_env()
    )
    try:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) > 0
    finally:
        proc.kill()
        proc.wait()
    left = sorted(os.listdir(private_tmp))
    assert [n for n in left if n.startswith(PREFIXES)] == left and len(left) == 2, left
    _until(lambda: all(_ended(private_tmp / name) for name in left), 60.0)
    LocalExecutor(devices=[], cpu_slots=0).close()
    assert sorted(os.listdir(private_tmp)) == []
