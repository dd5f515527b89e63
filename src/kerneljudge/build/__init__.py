"""Build stage: compile a candidate in its own process, with no GPU visible, cached by content.

The cache key is the sha256 of the candidate's source, its backend and the toolchain fingerprint
(:func:`kerneljudge.build.toolchain.fingerprint`: torch, CUDA, compiler versions, target arch), so a
candidate never builds twice on the same toolchain. Each entry is a folder holding the source,
the extension build tree (``ext/``, used as ``TORCH_EXTENSIONS_DIR`` by the build and run
workers alike) and ``build-result.json``. Failed builds are cached too; timed-out ones are not.
The same source may come under another file name: a stored result names the candidate's file
:data:`SOURCE_NAME`, which is replaced by the current candidate's name when it is read.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kerneljudge.build import pch, toolchain
from kerneljudge.build.log import parse_diagnostics, shape_log, trace_to_candidate
from kerneljudge.candidate import Candidate
from kerneljudge.candidate.backends import IMPORT_ONLY_BACKENDS
from kerneljudge.errors import BuildCacheError, ConfigError
from kerneljudge.verdict import BuildResult, CompilerMessage, decode
from kerneljudge.worker import confine, exits
from kerneljudge.worker.sandbox import candidate_environment, child_pids
from kerneljudge.worker.torchlog import NO_CUDA_RUNTIME

__all__ = ["BuildCache", "build", "default_cache_dir", "toolchain_environment"]

_SRC_DIR = str(Path(__file__).resolve().parents[2])
DEFAULT_BUILD_TIMEOUT_S = 300.0
#: Stands for the candidate's file name in a stored build result (its log and messages).
SOURCE_NAME = "<kerneljudge:source-name>"


def default_cache_dir() -> Path:
    """``$KERNELJUDGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kerneljudge``, else
    ``~/.cache/kerneljudge``."""
    env = os.environ.get("KERNELJUDGE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kerneljudge"


class BuildCache:
    """Build outputs on disk, one folder per cache key.

    Args:
        root: the cache folder (created on first use).
    """

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = (Path(root) if root is not None else default_cache_dir()).resolve()

    def check_writable(self) -> None:
        """Make the cache's ``builds`` folder and write a file there (removed again).

        Raises:
            ConfigError: (field ``cache_dir``) the folder cannot be made or written.
        """
        probe = self.root / "builds" / f".probe-{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(probe, flags, 0o600))
            probe.unlink()
        except OSError as exc:
            why = f"cache_dir {self.root} cannot hold builds: {exc.strerror or exc}"
            raise ConfigError("cache_dir", why) from None

    def key(self, candidate: Candidate, arch: str) -> str:
        """sha256 of source, backend and toolchain fingerprint."""
        blob = json.dumps(
            {
                "source": candidate.sha256,
                "backend": candidate.backend,
                "toolchain": toolchain.fingerprint(arch),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def entry(self, key: str) -> Path:
        return self.root / "builds" / key[:2] / key

    def load(self, key: str, name: str = "candidate") -> BuildResult | None:
        """The stored result of ``key`` with its candidate file named ``name``; None when there
        is none (or it cannot be read).

        An entry written before file names were stored as :data:`SOURCE_NAME` (``build.json``)
        is used only when it succeeded: a failed one names the file of its first build. Lines
        of torch's ``No CUDA runtime is found`` notice, which logs of earlier build workers
        hold, are left out of the log.
        """
        for file in ("build-result.json", "build.json"):
            try:
                result = decode(BuildResult, json.loads((self.entry(key) / file).read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if file == "build.json" and not result.ok:
                return None
            # Logs of builds before the build worker dropped torch's notice still hold it.
            log = "\n".join(ln for ln in result.log.split("\n") if NO_CUDA_RUNTIME not in ln)
            return _named(dataclasses.replace(result, log=log), SOURCE_NAME, name)
        return None

    def store(self, key: str, result: BuildResult, name: str = "candidate") -> None:
        """Store ``result`` of ``key``, whose candidate file is named ``name`` in it (stored as
        :data:`SOURCE_NAME`)."""
        blob = json.dumps(dataclasses.asdict(_named(result, name, SOURCE_NAME)))
        write_new(self.real_entry(key) / "build-result.json", blob.encode())

    def real_entry(self, key: str) -> Path:
        """:meth:`entry`, made a real folder down from the cache's root: a component that is a
        link or not a folder is removed first. Run workers may write anywhere beneath
        ``builds/``, so one could have left a link there to a folder elsewhere, through which
        this process (not confined) would write.

        Raises:
            BuildCacheError: a folder could not be made, or the entry still resolved elsewhere
                at the third try (something put a link back each time).
        """
        entry = self.entry(key)
        for _ in range(3):
            here = self.root
            try:
                for part in entry.relative_to(self.root).parts:
                    here = here / part
                    if here.is_symlink() or (here.exists() and not here.is_dir()):
                        here.unlink()
                    here.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                why = f"the build cache entry {entry} cannot be made: {exc}"
                raise BuildCacheError(why) from None
            if os.path.realpath(entry) == str(entry):
                return entry
        raise BuildCacheError(f"the build cache entry {entry} kept resolving elsewhere")

    @contextmanager
    def locked(self, key: str) -> Iterator[Path]:
        """Hold the entry's lock (other processes building the same key wait)."""
        entry = self.real_entry(key)
        path = entry / ".lock"
        if path.is_symlink() or (path.exists() and not path.is_file()):
            _remove(path)
        # Never truncated, never followed: a link put there now fails the open.
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            why = f"the build cache's lock {path} cannot be opened: {exc}"
            raise BuildCacheError(why) from None
        with os.fdopen(fd, "r+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield entry
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    """Remove ``path``: a link or file unlinked, a folder removed with what it holds (links in
    it removed, not followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def open_new(path: Path) -> int:
    """A descriptor of a new, empty regular file at ``path`` (open for writing): whatever was
    there (a link a run worker left, say) is removed first, and the open neither follows a
    link nor opens a file put there meanwhile (``O_EXCL | O_NOFOLLOW``).

    Raises:
        BuildCacheError: it cannot be made (the folder is not writable or full), or something
            was put at ``path`` between its removal and the open.
    """
    try:
        if path.is_symlink() or path.exists():
            _remove(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise BuildCacheError(f"{path} cannot be written in the build cache: {exc}") from None


def write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a new file renamed into place: a link at ``path`` is
    replaced, never written through (:func:`open_new` for the temporary file).

    Raises:
        BuildCacheError: it cannot be written (the folder is not writable or full, or something
            was put in the temporary file's place).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = open_new(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BuildCacheError(f"{path} cannot be written in the build cache: {exc}") from None


def _named(result: BuildResult, old: str, new: str) -> BuildResult:
    """``result`` with the candidate's file name ``old`` replaced by ``new``: in the messages
    that name it as their file, and at the start of the log's lines that begin with ``old:``
    (where :func:`kerneljudge.build.log.shape_log` puts it)."""
    if result.ok or old == new:
        return result
    messages = tuple(
        dataclasses.replace(m, file=new) if m.file == old else m for m in result.messages
    )
    head = f"{old}:"
    log = "\n".join(
        new + line[len(old) :] if line.startswith(head) else line for line in result.log.split("\n")
    )
    return dataclasses.replace(result, messages=messages, log=log)


#: A ``load_inline`` baton older than this (seconds) is stale: no load or build of a cached
#: candidate holds one for longer than the longest run or build timeout.
STALE_BATON_S = 300.0


def clear_stale_batons(cache: BuildCache, key: str, older_than_s: float = STALE_BATON_S) -> int:
    """Remove ``load_inline`` batons left in a cache entry by a killed process (torch versions
    whose extension loader takes an exclusive-create ``lock`` file, ``FileBaton``).

    Such a loader takes the extension folder's ``lock`` file on every load, also of an
    up-to-date build, and waits for ever while another process's file is there; a worker
    killed while holding it would make every later load of the candidate a timeout. Builds
    run while holding the entry's own lock, held here too. Loaders that lock the file with
    ``flock`` instead (``FileLock``, newer torch) release it when their process dies and leave
    the file behind, so nothing is removed for them.

    Returns the number of files removed.
    """
    # Imported here only to read which loader this torch has: its import warns "No CUDA
    # runtime is found" on every machine without a GPU, about a toolkit this process never uses
    # (builds run in the build worker, with CUDA_HOME from kerneljudge.build.toolchain).
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)

    if hasattr(cpp_extension, "FileLock"):
        return 0
    removed = 0
    with cache.locked(key) as entry:
        now = time.time()
        for lock in entry.glob("ext/*/lock"):
            try:
                if any(p.is_symlink() for p in (lock.parent.parent, lock.parent, lock)):
                    continue  # not a baton torch left: nothing is removed through a link
                if now - lock.stat().st_mtime > older_than_s:
                    lock.unlink()
                    removed += 1
            except OSError:
                pass
    return removed


def _static_failure(candidate: Candidate) -> BuildResult | None:
    issues = candidate.static_issues()
    if not issues:
        return None
    issue = issues[0]
    msg = CompilerMessage(
        file=candidate.name,
        line=issue.line,
        column=None,
        severity="error",
        message=issue.message,
        candidate_line=issue.line,
    )
    log = shape_log([msg], "", candidate.source, candidate.name)
    return BuildResult(ok=False, backend=candidate.backend, messages=(msg,), log=log)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the build worker, every descendant of it and its process group, and reap it."""
    for pid in [*child_pids(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def known_build(candidate: Candidate, *, cache: BuildCache, arch: str) -> BuildResult | None:
    """The build's result when it is known without compiling: a static failure (empty source,
    syntax error) or a cached build; None when :func:`build` would have to compile."""
    return _static_failure(candidate) or _cached(cache, cache.key(candidate, arch), candidate.name)


def _cached(cache: BuildCache, key: str, name: str) -> BuildResult | None:
    cached = cache.load(key, name)
    return None if cached is None else dataclasses.replace(cached, cached=True)


def build(
    candidate: Candidate,
    *,
    cache: BuildCache,
    arch: str,
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
) -> BuildResult:
    """Build ``candidate`` (or fetch its cached build).

    The build worker imports the candidate with ``CUDA_VISIBLE_DEVICES`` empty, its
    ``TORCH_EXTENSIONS_DIR`` in the cache entry and ``TORCH_CUDA_ARCH_LIST=arch``; import-time
    ``load_inline`` calls compile there. A Python syntax error fails before any process starts;
    a module that does not define ``ModelNew`` when imported fails here (compiled backends) or
    when the candidate worker imports it (``torch``, ``triton``).

    Args:
        candidate: what to build.
        cache: where builds are kept.
        arch: the target compute capability, e.g. ``"9.0"`` (see :func:`toolchain.target_arch`).
        timeout_s: limit of the build (seconds of the host's time,
            :class:`~kerneljudge.worker.exits.HostShareClock`: wall seconds on a host with a CPU
            free for each runnable task, up to 3x longer on a loaded one); the build's process
            group is killed.

    The build worker runs confined (:mod:`kerneljudge.worker.confine`): no process it or a tool
    it starts (``ninja`` runs what a ``build.ninja`` says) outlives the build, and none of them
    writes outside the cache entry.

    C++ compiles use the cache's shared precompiled ``torch/extension.h`` made for their options
    (:mod:`kerneljudge.build.pch`, unless ``KERNELJUDGE_PCH=0``). When a compile found none, the
    variant it asked for is made while the build runs, and the build returns once it is made,
    within the build's own time limit (a build that runs out of time stops it).

    Returns:
        A :class:`BuildResult`; ``ok`` False with shaped ``log`` and ``messages`` on failure,
        ``timed_out`` True when the limit was hit.

    Raises:
        BuildCacheError: the cache entry, its source, log or result could not be written.
    """
    static = _static_failure(candidate)
    if static is not None:
        return static
    key = cache.key(candidate, arch)
    with cache.locked(key) as entry:
        cached = _cached(cache, key, candidate.name)
        if cached is not None:
            return cached
        source_path = entry / "candidate.py"
        write_new(source_path, candidate.source.encode())
        if candidate.backend in IMPORT_ONLY_BACKENDS:
            # Nothing to compile ahead of time: the run worker's import is the build.
            result = BuildResult(ok=True, backend=candidate.backend, cache_key=key)
            cache.store(key, result, candidate.name)
            return result
        result_path = entry / "result.json"
        result_path.unlink(missing_ok=True)
        log_path = entry / "build.log"
        env = candidate_environment(dict(os.environ))
        env.update(toolchain_environment(cache, key, arch))
        env["TMPDIR"] = str(entry)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SRC_DIR, env.get("PYTHONPATH")]))
        started = time.monotonic()
        with os.fdopen(open_new(log_path), "wb") as log_file:
            # Confined (see kerneljudge.worker.confine): the build worker and every tool it
            # starts live in their own PID namespace, which ends with the build worker, and
            # may write only inside this cache entry.
            argv = ["kerneljudge.worker.build", str(source_path), str(result_path)]
            proc = confine.spawn_in(entry, argv, log_file, env)
            store = pch.store_dir(cache.root)
            precompilers = [pch.Precompiler(store, entry, env)] if toolchain.pch_enabled() else []
            if "KERNELJUDGE_CUDA_PCH_SALT" in env:
                precompilers.append(pch.Precompiler(store, entry, env, cuda=True))
            finished = False

            def poll() -> None:
                for precompiler in precompilers:
                    precompiler.poll()

            clock = exits.HostShareClock()  # a loaded host does not end an honest build
            try:
                finished = exits.exited(proc, timeout_s, poll, clock)
            finally:  # also when the wait failed: nothing of the build outlives it
                _kill_group(proc)  # the rest of its process group ends with it
                for precompiler in precompilers:
                    precompiler.finish(started + max(timeout_s, clock.wall()) if finished else None)
            if not finished:
                msg = f"the build did not finish within {timeout_s:g} s"
                if clock.wall() > 1.05 * timeout_s:
                    msg += f" of the host's time ({clock.wall():.0f} s of wall time, loaded)"
                return BuildResult(
                    ok=False,
                    backend=candidate.backend,
                    duration_s=time.monotonic() - started,
                    cache_key=key,
                    timed_out=True,
                    messages=(CompilerMessage("", None, None, "error", msg),),
                    log=msg,
                )
        duration = time.monotonic() - started
        raw = log_path.read_text(errors="replace")
        try:
            outcome = json.loads(result_path.read_text())
        except (OSError, ValueError):
            outcome = {
                "ok": False,
                "error": "the build process died (exit status "
                f"{exits.exit_status(proc.returncode)})",
                "lineno": None,
            }
        if outcome.get("ok"):
            result = BuildResult(
                ok=True,
                backend=candidate.backend,
                duration_s=duration,
                cache_key=key,
                log=raw[-4000:],
            )
        else:
            error = str(outcome.get("error", ""))
            full = error + "\n" + raw
            messages = parse_diagnostics(full)
            messages = trace_to_candidate(messages, candidate.source, entry / "ext")
            if not any(m.severity == "error" for m in messages):
                line = outcome.get("lineno")
                first = error.splitlines()[0] if error else "the build failed"
                messages.insert(
                    0, CompilerMessage(candidate.name, line, None, "error", first, line)
                )
            messages.sort(key=lambda m: m.severity != "error")
            log = shape_log(messages, full, candidate.source, candidate.name)
            result = BuildResult(
                ok=False,
                backend=candidate.backend,
                duration_s=duration,
                cache_key=key,
                messages=tuple(messages),
                log=log,
                rejected=bool(outcome.get("rejected")),
            )
        cache.store(key, result, candidate.name)
        return result


def toolchain_environment(cache: BuildCache, key: str, arch: str) -> dict[str, str]:
    """The toolchain's variables for a cache entry's build and run workers alike
    (:func:`kerneljudge.build.toolchain.build_environment`, with the cache's shared
    precompiled headers)."""
    return toolchain.build_environment(arch, extensions_dir(cache, key), pch.store_dir(cache.root))


def extensions_dir(cache: BuildCache, key: str) -> Path:
    """The ``TORCH_EXTENSIONS_DIR`` of a cache entry."""
    return cache.entry(key) / "ext"
