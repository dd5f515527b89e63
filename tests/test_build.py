"""The build stage: content-hash cache, isolation, and compiler errors traced to candidate lines.

Two tests run a real compiler (one C++ and one CUDA build that fail on a known line); they share
the checkout's test build cache, so they compile once per machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kerneljudge.build import BuildCache, build, clear_stale_batons, toolchain
from kerneljudge.candidate import Candidate

CANDIDATES = Path(__file__).parent / "fixtures" / "candidates"


def test_cache_miss_then_hit(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path)
    cand = Candidate.from_file(CANDIDATES / "good.py")
    first = build(cand, cache=cache, arch="9.0")
    again = build(cand, cache=cache, arch="9.0")
    assert first.ok and not first.cached
    assert again.ok and again.cached and again.cache_key == first.cache_key
    # Another arch or another source is another entry.
    other_arch = build(cand, cache=cache, arch="8.0")
    assert not other_arch.cached and other_arch.cache_key != first.cache_key
    edited = Candidate.from_source(cand.source + "\n# edited\n")
    assert not build(edited, cache=cache, arch="9.0").cached


def test_cache_key_covers_the_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BuildCache(tmp_path)
    cand = Candidate.from_file(CANDIDATES / "good.py")
    key = cache.key(cand, "9.0")
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "Build cuda_99.9")
    assert cache.key(cand, "9.0") != key
    again = cache.key(cand, "9.0")
    monkeypatch.setattr(toolchain, "ninja_version", lambda: "1.99 (/elsewhere/ninja)")
    assert cache.key(cand, "9.0") != again


def test_both_workers_find_the_same_ninja(tmp_path: Path) -> None:
    """The build and run workers get one PATH, this interpreter's folder first, so the
    ninja that builds is the ninja that checks the build on load."""
    import shutil
    import sys

    env = toolchain.build_environment("9.0", tmp_path)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    found = shutil.which("ninja", path=env["PATH"])
    assert found is not None and found in toolchain.ninja_version()


def test_failed_builds_are_cached_and_loaded(tmp_path: Path) -> None:
    """A failing build (here a Python error at import in a cpp-backend file) is not redone."""
    cache = BuildCache(tmp_path)
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "import torch.nn as nn\n"
        "raise RuntimeError('configuration step failed')\n"
        "ext = load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    cand = Candidate.from_source(src)
    assert cand.backend == "cpp"
    first = build(cand, cache=cache, arch="9.0")
    assert not first.ok and first.messages[0].candidate_line == 3
    assert "configuration step failed" in first.log
    second = build(cand, cache=cache, arch="9.0")
    assert second.cached and not second.ok and second.messages == first.messages


def test_stale_load_inline_locks_are_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils import cpp_extension

    cache = BuildCache(tmp_path)
    ext = cache.entry("k") / "ext"
    (ext / "old").mkdir(parents=True)
    (ext / "fresh").mkdir()
    for name in ("old", "fresh"):
        (ext / name / "lock").write_text("")
    past = os.path.getmtime(ext / "old" / "lock") - 600
    os.utime(ext / "old" / "lock", (past, past))
    if hasattr(cpp_extension, "FileLock"):  # flock-based: a dead holder leaves no lock held
        assert clear_stale_batons(cache, "k") == 0
        monkeypatch.delattr(cpp_extension, "FileLock")
    assert clear_stale_batons(cache, "k") == 1
    assert not (ext / "old" / "lock").exists()
    assert (ext / "fresh" / "lock").exists()  # a load may hold it right now


def test_build_timeout_kills_the_build(tmp_path: Path) -> None:
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "import time\nimport torch.nn as nn\ntime.sleep(600)\n"
        "ext = load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    result = build(Candidate.from_source(src), cache=BuildCache(tmp_path), arch="9.0", timeout_s=3)
    assert result.timed_out and not result.ok
    assert "did not finish within 3 s" in result.log


def test_the_build_clock_counts_the_host_share_a_build_had(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build limit is kept in seconds of the host: on a loaded host each wall second counts
    the share of the CPUs a runnable task gets there, never less than MIN_SHARE."""
    import subprocess
    import sys
    import time

    from kerneljudge.worker import exits

    now = [1000.0]  # the clock's wall time, moved by hand
    with monkeypatch.context() as m:
        m.setattr(exits.time, "monotonic", lambda: now[0])
        for runnable, share in [(None, 1), (2, 1), (3, 1), (6, 0.4), (1000, exits.MIN_SHARE)]:
            m.setattr(exits, "_runnable", lambda r=runnable: r)
            clock = exits.HostShareClock(cpus=2)
            now[0] += 10.0  # ten wall seconds to the next tick
            assert clock.tick() == pytest.approx(10.0 * share), runnable
            assert clock.wall() == 10.0
    # A command that outlives its limit is still ended on a loaded host, later in wall time.
    monkeypatch.setattr(exits, "_runnable", lambda: 5)  # 4 others on 2 CPUs: half a second a second
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        clock = exits.HostShareClock(cpus=2)
        assert not exits.exited(proc, 0.5, clock=clock)
        assert clock.elapsed >= 0.5 and time.monotonic() - started >= 1.0
    finally:
        proc.kill()
        proc.wait()


def test_build_sees_no_gpu(tmp_path: Path) -> None:
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "import os, torch\nimport torch.nn as nn\n"
        "assert os.environ['CUDA_VISIBLE_DEVICES'] == '' and not torch.cuda.is_available()\n"
        "if False:\n    load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    assert build(Candidate.from_source(src), cache=BuildCache(tmp_path), arch="9.0").ok


@pytest.mark.slow
def test_real_cpp_compile_error_maps_to_candidate_line(shared_cache: Path) -> None:
    cand = Candidate.from_file(CANDIDATES / "cpp_compile_error.py")
    assert cand.backend == "cpp"
    result = build(cand, cache=BuildCache(shared_cache), arch="9.0")
    assert not result.ok
    errors = [m for m in result.messages if m.severity == "error"]
    assert errors, result.log
    first = errors[0]
    assert "scale_factor" in first.message
    assert first.candidate_line == 9  # `p[i] = p[i] * scale_factor;`
    assert Path(first.file).name == "main.cpp" and first.line != 9
    assert result.log.startswith("cpp_compile_error.py:9: error:")


@pytest.mark.slow
@pytest.mark.skipif(toolchain.cuda_home() is None, reason="needs the CUDA compiler (nvcc)")
def test_real_cuda_compile_error_maps_to_candidate_line(shared_cache: Path) -> None:
    os.environ.setdefault("CUDA_HOME", toolchain.cuda_home() or "")
    cand = Candidate.from_file(CANDIDATES / "cuda_compile_error.py")
    assert cand.backend == "cuda"
    result = build(cand, cache=BuildCache(shared_cache), arch="9.0")
    assert not result.ok
    first = next(m for m in result.messages if m.severity == "error")
    assert "undeclared_scale" in first.message
    assert first.candidate_line == 8  # `y[i] = x[i] * undeclared_scale;`
    assert Path(first.file).name == "cuda.cu"
    assert "cuda_compile_error.py:8: error:" in result.log.splitlines()[0]


@pytest.mark.slow
def test_cached_compile_error_names_the_current_file(shared_cache: Path, tmp_path: Path) -> None:
    """The same failing source under two file names: the second build comes from the cache and
    its errors name its own file, not the first one's."""
    source = (CANDIDATES / "cpp_compile_error.py").read_text()
    first_path, second_path = tmp_path / "first_name.py", tmp_path / "second_name.py"
    first_path.write_text(source)
    second_path.write_text(source)
    cache = BuildCache(shared_cache)
    first = build(Candidate.from_file(first_path), cache=cache, arch="9.0")
    second = build(Candidate.from_file(second_path), cache=cache, arch="9.0")
    agent = build(Candidate.from_source(source, name="kernel_code"), cache=cache, arch="9.0")
    assert second.cached and agent.cached and not (first.ok or second.ok or agent.ok)
    assert first.log.startswith("first_name.py:9: error:")
    assert second.log.startswith("second_name.py:9: error:")
    assert agent.log.startswith("kernel_code:9: error:")
    assert all("<kerneljudge:" not in r.log for r in (first, second, agent))
    assert "first_name.py" not in second.log and "first_name.py" not in agent.log
    assert [m.candidate_line for m in second.messages] == [m.candidate_line for m in first.messages]


def test_stored_results_name_the_file_they_are_read_for(tmp_path: Path) -> None:
    """A failure at import (no compiler): the stored message and log take the reader's name."""
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "import torch.nn as nn\n"
        "raise RuntimeError('configuration step failed')\n"
        "ext = load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    cache = BuildCache(tmp_path)
    first = build(Candidate.from_source(src, name="a.py"), cache=cache, arch="9.0")
    second = build(Candidate.from_source(src, name="kernel_code"), cache=cache, arch="9.0")
    assert second.cached and not second.ok
    assert first.log.startswith("a.py:3: error:") and first.messages[0].file == "a.py"
    assert second.log.startswith("kernel_code:3: error:")
    assert second.messages[0].file == "kernel_code" and "a.py" not in second.log


def test_links_left_in_the_cache_are_replaced_never_written_through(tmp_path: Path) -> None:
    """A run worker may write anywhere beneath ``builds/``: a link it leaves where the judge
    later writes (an entry's files, or the entry's folder itself) is replaced, and nothing is
    written where it pointed."""
    cache = BuildCache(tmp_path / "cache")
    src = (
        "from torch.utils.cpp_extension import load_inline\n"
        "import torch.nn as nn\n"
        "if False:\n    load_inline(name='never', cpp_sources=[''])\n"
        "class ModelNew(nn.Module):\n    pass\n"
    )
    cand = Candidate.from_source(src)
    entry = cache.entry(cache.key(cand, "9.0"))
    entry.mkdir(parents=True)
    victims = tmp_path / "victims"
    victims.mkdir()
    names = ("candidate.py", ".lock", "build.log", "build-result.json")
    for name in names:
        (victims / name).write_text("keep")
        (entry / name).symlink_to(victims / name)
    result = build(cand, cache=cache, arch="9.0")
    assert result.ok, result.log
    assert [(victims / n).read_text() for n in names] == ["keep"] * len(names)
    assert not any((entry / n).is_symlink() for n in names)
    assert (entry / "candidate.py").read_text() == src
    assert build(cand, cache=cache, arch="9.0").cached  # its stored result is read back
    # A link in place of an entry's folder: the entry is made a real folder again.
    other = Candidate.from_source(src + "# another entry\n")
    other_entry = cache.entry(cache.key(other, "9.0"))
    other_entry.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other_entry.symlink_to(elsewhere, target_is_directory=True)
    assert build(other, cache=cache, arch="9.0").ok
    assert not other_entry.is_symlink() and (other_entry / "candidate.py").is_file()
    assert list(elsewhere.iterdir()) == []


def test_a_cache_that_cannot_be_written_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder that cannot hold builds is refused when the judge is made (a
    configuration error naming ``cache_dir``); an entry that cannot be made, or that keeps
    leading elsewhere however often it is made a real folder, fails the build with a
    :class:`BuildCacheError` (a ``KernelJudgeError``: one line at the command line)."""
    from kerneljudge import Judge, JudgeConfig
    from kerneljudge.errors import BuildCacheError, ConfigError, KernelJudgeError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot hold builds") as refused:
        Judge("causal_gqa", JudgeConfig(cache_dir=blocker / "cache", device="cpu"))
    assert refused.value.field == "cache_dir"

    cand = Candidate.from_source("import torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n")
    with pytest.raises(BuildCacheError, match="cannot be made") as failed:
        build(cand, cache=BuildCache(blocker / "cache"), arch="9.0")
    assert isinstance(failed.value, KernelJudgeError) and isinstance(failed.value, OSError)

    cache = BuildCache(tmp_path / "cache")
    cache.check_writable()
    entry = cache.entry(cache.key(cand, "9.0"))
    real = os.path.realpath
    monkeypatch.setattr(
        os.path, "realpath", lambda p, *a, **k: "/elsewhere" if str(p) == str(entry) else real(p)
    )
    with pytest.raises(BuildCacheError, match="kept resolving elsewhere"):
        build(cand, cache=cache, arch="9.0")
    monkeypatch.undo()
    assert build(cand, cache=cache, arch="9.0").ok
    assert list((cache.root / "builds").glob(".probe-*")) == []
