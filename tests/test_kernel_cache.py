"""A reference worker's own kernel cache (kerneljudge.worker.kernel_cache): made in its scratch
folder only where Landlock confines candidates, filled from this process's seed, protected
while the worker lives; the seed takes only regular files, only at the worker's ready, never
past its size bound."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.worker import confine, kernel_cache
from kerneljudge.worker.process import WorkerProcess


@pytest.fixture(autouse=True)
def _no_seed() -> Iterator[None]:
    kernel_cache.forget()
    yield
    kernel_cache.forget()


def _landlock(monkeypatch: pytest.MonkeyPatch, abi: int) -> None:
    found = confine.Features("", (), False, False, abi)
    monkeypatch.setattr(confine, "features", lambda: found)


def test_off_without_a_cuda_device_or_without_landlock_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = {"USE_PYTORCH_KERNEL_CACHE": "0"}
    _landlock(monkeypatch, 7)
    assert kernel_cache.environment(tmp_path, "cpu") == off
    _landlock(monkeypatch, 2)
    assert kernel_cache.environment(tmp_path, "cuda:0") == off
    assert not (tmp_path / kernel_cache.FOLDER).exists()
    _landlock(monkeypatch, 7)
    assert kernel_cache.usable("cuda:0")
    # The temporary folder beneath a folder where candidates' JIT compilers write: a candidate
    # already running could write in a reference worker's folder made there.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert not kernel_cache.usable("cuda:0")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "kj-candidate-x"))
    assert not kernel_cache.usable("cuda:0")


def test_a_folder_is_made_private_filled_with_the_seed_and_protected_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _landlock(monkeypatch, 7)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    env = kernel_cache.environment(first, "cuda:0")
    folder = first / kernel_cache.FOLDER
    assert env == {"USE_PYTORCH_KERNEL_CACHE": "1", "PYTORCH_KERNEL_CACHE_PATH": str(folder)}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and not list(folder.iterdir())
    (folder / "kernel_a_sm90").write_bytes(b"cubin a")  # what the worker compiled at its start
    assert kernel_cache.keep_seed(first) == 1

    kernel_cache.environment(second, "cuda:0")
    made = second / kernel_cache.FOLDER
    assert (made / "kernel_a_sm90").read_bytes() == b"cubin a"
    assert confine.rule_folders([str(made)]) == []  # no confined process gets a rule there
    kernel_cache.release(second)
    assert confine.rule_folders([str(made)]) == [os.path.realpath(made)]
    kernel_cache.release(first)


def test_the_seed_takes_regular_files_it_lacks_and_nothing_past_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / kernel_cache.FOLDER
    folder.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"the supervisor's file")
    (folder / "link").symlink_to(secret)
    (folder / "sub").mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "k1").write_bytes(b"one")
    assert kernel_cache.keep_seed(tmp_path) == 1
    assert kernel_cache.seed() == {"k1": b"one"}

    (folder / "k1").write_bytes(b"changed")  # a name the seed has is not read again
    (folder / "k2").write_bytes(b"two")
    assert kernel_cache.keep_seed(tmp_path) == 2
    assert kernel_cache.seed() == {"k1": b"one", "k2": b"two"}

    monkeypatch.setattr(kernel_cache, "MAX_SEED_BYTES", 10)
    (folder / "k3").write_bytes(b"x" * 8)  # 3 + 3 + 8 bytes: past the bound, nothing added
    assert kernel_cache.keep_seed(tmp_path) == 2
    assert kernel_cache.keep_seed(tmp_path / "missing") == 2


def _kernels_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers' ``ready`` messages say their run-time kernels compiled (a CPU worker's say not)."""
    recv = WorkerProcess._recv

    def said(self: WorkerProcess, op: str, *args: object) -> dict[str, object]:
        msg = recv(self, op, *args)  # type: ignore[arg-type]
        return {**msg, "kernels": True} if op == "start" else msg

    monkeypatch.setattr(WorkerProcess, "_recv", said)


def _first_worker_leaves(data: bytes) -> None:
    """Start a reference worker that leaves ``data`` in its kernel folder at its start (as its
    compiled kernel ``kernel_digest``), wait for its ready, close it."""
    first = WorkerProcess("reference", "cpu", threads=1)
    try:
        (first.scratch / kernel_cache.FOLDER / "kernel_digest").write_bytes(data)
        first.wait_ready()
    finally:
        first.close()


def test_a_reference_worker_starts_with_the_seed_and_gives_its_own_kernels_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through real workers (on the CPU, with the cache forced on): the first worker's folder
    holds, at its ready, what it left there at its start; the next worker starts with those
    files, its environment naming its own folder."""
    monkeypatch.setattr(kernel_cache, "usable", lambda device: True)
    _kernels_ready(monkeypatch)
    _first_worker_leaves(b"compiled")
    assert kernel_cache.seed() == {"kernel_digest": b"compiled"}
    second = WorkerProcess("reference", "cpu", threads=1)
    try:
        second.wait_ready()
        folder = second.scratch / kernel_cache.FOLDER
        assert (folder / "kernel_digest").read_bytes() == b"compiled"
        with open(f"/proc/{second.worker_pid()}/environ", "rb") as f:
            env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        assert env[b"USE_PYTORCH_KERNEL_CACHE"] == b"1"
        assert env[b"PYTORCH_KERNEL_CACHE_PATH"] == str(folder).encode()
    finally:
        second.close()
    assert confine.rule_folders([str(folder)]) == [os.path.realpath(folder)]


def test_a_reference_worker_whose_kernels_did_not_compile_or_load_drops_the_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded kernel that does not load (a file cut short when it was written) must not be
    given to every later worker: a ready without its kernels empties the seed, and what that
    worker's folder holds is not taken."""
    monkeypatch.setattr(kernel_cache, "usable", lambda device: True)
    _kernels_ready(monkeypatch)
    _first_worker_leaves(b"cut")
    assert kernel_cache.seed() == {"kernel_digest": b"cut"}
    monkeypatch.undo()
    monkeypatch.setattr(kernel_cache, "usable", lambda device: True)
    second = WorkerProcess("reference", "cpu", threads=1)  # a CPU worker: no kernels compiled
    try:
        assert (second.scratch / kernel_cache.FOLDER / "kernel_digest").exists()
        second.wait_ready()
        assert second.kernels is False
    finally:
        second.close()
    assert kernel_cache.seed() == {}
