"""Shared precompiled ``torch/extension.h`` for C++ compiles: the supervisor's side.

A compile in a build uses a header made for its exact options (a *variant*) when the store has
one whose bytes match its manifest (:mod:`kerneljudge.build.pch_cxx`, the compiler the build
runs). When it had none, the compile leaves a request, and :class:`Precompiler` makes that
variant while the build goes on, so that the next build with the same options uses it.

What keeps a shared header from carrying one candidate's influence into another's binary:

* the store is written only here, by a confined process (:mod:`kerneljudge.worker.confine`)
  that may write only its own staging folder, never by a build worker;
* a variant is made only from options that name no file other than the toolchain's own
  headers (:func:`refusal`): ``-D``/``-U`` without a path, ``-O``, ``-std=``, ``-f``/``-m``/
  ``-W`` code-generation and warning options, ``-isystem``/``-I`` of torch's, Python's and
  CUDA's include folders; anything else (``-include``, ``-I`` of a candidate's folder, a
  plugin, a response file, a profile) makes no shared header;
* the key covers the options in order and the toolchain (:func:`salt`), so a header is used
  only by compiles with the options it was made with; the compiler checks that again
  (GCC ignores a header made with other options);
* a header is used only when its size and SHA-256 match the manifest written when it was made;
  a damaged one is made again here, never given to a compile.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import IO

from kerneljudge.build import pch_cuda, pch_cxx, toolchain
from kerneljudge.worker import confine, exits

__all__ = ["PCH_TIMEOUT_S", "Precompiler", "environment", "refusal", "salt", "store_dir"]

_log = logging.getLogger(__name__)

#: Longest a variant's header may take to make (seconds from the start); about 60 s on one
#: core of the 2-core development VM (docs/benchmarks/2026-12-02-cpu-precompiled-header.md).
PCH_TIMEOUT_S = 600.0
#: How long a variant that failed to be made is not tried again (seconds).
FAILED_TTL_S = 3600.0
#: Largest request file read (bytes).
_REQUEST_LIMIT = 64 << 10
_POLL_S = 0.25
#: ``-f`` options that read or write files, or load code, besides the compile's own.
_FILE_OPTIONS = (
    "-fplugin",
    "-fprofile",
    "-fauto-profile",
    "-fdump",
    "-fopt-info",
    "-fsave-optimization-record",
    "-fcallgraph-info",
    "-fstack-usage",
    "-fdiagnostics",
    "-fdeps",
    "-fmodule",
    "-fdebug-prefix",
    "-ffile-prefix",
    "-fmacro-prefix",
    "-finstrument-functions-exclude-file",
)


def store_dir(cache_root: Path) -> Path:
    """``$KERNELJUDGE_PCH_DIR``, else ``CACHE_ROOT/pch``, resolved."""
    env = os.environ.get("KERNELJUDGE_PCH_DIR")
    return (Path(env) if env else Path(cache_root) / "pch").resolve()


def real_compiler() -> str:
    """The compiler the wrapper runs: ``$CXX`` when it is not the wrapper itself, else ``c++``."""
    cxx = os.environ.get("CXX")
    return cxx if cxx and Path(cxx).resolve() != toolchain.PCH_WRAPPER.resolve() else "c++"


def header_path() -> Path:
    """torch's ``torch/extension.h`` (the header every variant precompiles)."""
    import torch

    return Path(torch.__file__).resolve().parent / "include" / pch_cxx.HEADER


def salt() -> str:
    """SHA-256 of what a header's bytes depend on besides the options: the build protocol,
    torch (version, git revision, header path), the real compiler (:func:`real_compiler`: its
    path and ``--version``), Python and the machine."""
    return _salt_of(real_compiler())


@functools.cache
def _salt_of(real: str) -> str:
    import torch

    try:
        out = subprocess.run([real, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.splitlines()[0] if out.stdout else "unavailable"
    except (OSError, subprocess.TimeoutExpired):
        version = "unavailable"
    blob = {
        "protocol": toolchain.BUILD_PROTOCOL,
        "torch": [torch.__version__, str(torch.version.git_version), str(header_path())],
        "compiler": [shutil.which(real) or real, version],
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def environment(store: Path) -> dict[str, str]:
    """The build and run workers' variables that make torch's builder compile through the
    wrapper with ``store``; with :func:`~kerneljudge.build.toolchain.cuda_pch_enabled`, CUDA
    host compiles share prefixes there too (:mod:`kerneljudge.build.pch_cuda`)."""
    env = {
        "CXX": str(toolchain.PCH_WRAPPER),
        "KERNELJUDGE_CXX": real_compiler(),
        "KERNELJUDGE_PYTHON": sys.executable,
        "KERNELJUDGE_PCH_DIR": str(store),
        "KERNELJUDGE_PCH_SALT": salt(),
        "KERNELJUDGE_PCH_HEADER": str(header_path()),
    }
    if toolchain.cuda_pch_enabled() and toolchain.cuda_home():
        from kerneljudge.build import pch_nvcc

        env["KERNELJUDGE_CUDA_PCH_SALT"] = pch_nvcc.cuda_salt()
    return env


@functools.cache
def _trusted_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The toolchain's include folders as they are spelled (torch's, Python's, CUDA's) and as
    they resolve."""
    import torch

    # torch's include folder, as torch's builder names it and as it resolves
    spelled = [str(header_path().parents[1])]
    spelled.append(os.path.normpath(os.path.join(os.path.dirname(torch.__file__), "include")))
    for name in ("include", "platinclude"):
        path = sysconfig.get_paths().get(name)
        if path:
            spelled.append(os.path.normpath(path))
    home = toolchain.cuda_home()
    if home:
        spelled += [os.path.normpath(os.path.join(home, d)) for d in ("include", "targets")]
    return tuple(spelled), tuple(os.path.realpath(p) for p in spelled)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _trusted_dir(path: str) -> bool:
    """An absolute folder, spelled without ``..``, ``.`` or doubled separators, beneath one of
    the toolchain's include folders both as spelled and as it resolves (so no link of a
    candidate's leads there: only the toolchain's own links, which no candidate can write)."""
    spelled, resolved = _trusted_roots()
    return (
        os.path.isabs(path)
        and os.path.normpath(path) == path
        and _under(path, spelled)
        and _under(os.path.realpath(path), resolved)
    )


def _safe_option(flag: str) -> bool:
    if "/" in flag or "," in flag or " " in flag or not flag.startswith("-") or flag == "-":
        return False
    if flag[:2] in ("-D", "-U"):
        name, _, value = flag[2:].partition("=")
        ok_value = all(c.isalnum() or c in '_.+-"' for c in value)
        return name.isidentifier() and (ok_value if flag[:2] == "-D" else not value)
    if flag in ("-O", "-Ofast", "-w", "-pthread", "-pedantic", "-g") or (
        len(flag) == 3 and flag[:2] in ("-O", "-g") and flag[2] in "0123sgz"
    ):
        return True
    if flag.startswith("-std="):
        return flag[5:].startswith(("c++", "gnu++")) and flag[5:].replace("+", "").isalnum()
    if flag.startswith(("-f", "-m", "-W")):
        if flag.startswith(_FILE_OPTIONS):  # -Wl,... -Wp,... -Wa,...: refused for their ","
            return False
        body = flag[2:].removeprefix("no-")
        head, _, value = body.partition("=")
        return (
            head[:1].isalpha()
            and all(c.isalnum() or c in "-_+" for c in head)
            and all(c.isalnum() or c in "_.+-" for c in value)
        )
    return False


def refusal(flags: list[str]) -> str | None:
    """Why no shared header is made for a compile with ``flags`` (its variant, see
    :func:`kerneljudge.build.pch_cxx.compile_parts`); None when one may be."""
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("-isystem", "-I"):
            if i + 1 >= len(flags) or not _trusted_dir(flags[i + 1]):
                return f"{flag} of a folder outside the toolchain's"
            i += 2
            continue
        if flag.startswith(("-isystem", "-I")) and len(flag) > 2:
            if not _trusted_dir(flag[8:] if flag.startswith("-isystem") else flag[2:]):
                return f"{flag}: a folder outside the toolchain's"
        elif not _safe_option(flag):
            return f"option {flag!r}"
        i += 1
    return None


def _read_request(path: Path) -> tuple[list[str], str]:
    """The options and the state a compile's record names. A record lies in a candidate's own
    entry: only a regular file is read (not a link, not a FIFO), at most
    :data:`_REQUEST_LIMIT` bytes.

    Raises:
        ValueError: it is not a request of that shape.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(str(exc)) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        try:
            asked = json.loads(f.read(_REQUEST_LIMIT))
        except (ValueError, RecursionError):
            raise ValueError("not JSON") from None
    flags = asked.get("flags") if isinstance(asked, dict) else None
    if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        raise ValueError("no list of options")
    state = asked.get("state")
    if state not in ("used", "missing", "damaged", "unmatched", "failed"):
        raise ValueError("no known state")
    return flags, state


def max_variants() -> int:
    """How many variants the store keeps (``$KERNELJUDGE_PCH_VARIANTS``, default 6: about
    4.7 GB at 790 MB each); making one more removes the least recently used."""
    try:
        return max(1, int(os.environ.get("KERNELJUDGE_PCH_VARIANTS", "6")))
    except ValueError:
        return 6


def variants(store: Path) -> list[Path]:
    """The store's variant folders, least recently used (or made) first."""
    try:
        found = [p for p in store.iterdir() if not p.name.startswith(".") and p.is_dir()]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _last_line(staging: Path | None) -> str:
    """The last line of a make's log (its compiler's last message)."""
    if staging is None:
        return "no log"
    try:
        with open(staging / "make.log", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2000))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip()[:300] if lines else "no message"


def _remove(folder: Path) -> None:
    """Take a variant folder out of the store at once (a rename), then delete it."""
    trash = folder.with_name(f".trash-{folder.name}.{os.getpid()}")
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


class Precompiler:
    """Makes, at most once per build, the header variant a compile of that build asked for.

    :meth:`poll` (called while the build runs) reads the first record a compile left in the
    build's extension folders. ``used``: the variant's folder is marked as just used (its
    time, for eviction). ``missing`` or ``damaged``: when its options are safe, the store
    lacks that variant (or holds it damaged) and the variant did not fail in the last
    :data:`FAILED_TTL_S` seconds, it starts making it; :meth:`finish` waits for it and
    installs it. Only one process makes a variant at a time (a lock file per key): a build that
    finds it being made starts nothing. The store keeps :func:`max_variants` variants.

    Args:
        store: the store folder (:func:`store_dir`).
        entry: the build's cache entry (its ``ext/`` holds the records).
        env: the build worker's environment (the maker runs with it).
    """

    def __init__(self, store: Path, entry: Path, env: dict[str, str], cuda: bool = False) -> None:
        self.store, self.entry, self.env, self.cuda = store, entry, env, cuda
        self.outcome = "none asked for"
        self._asked = False
        self._next_poll = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        self._staging: Path | None = None
        self._folder: Path | None = None
        self._flags: list[str] = []
        self._started = 0.0

    def poll(self) -> None:
        """Look for a record (at most every 0.25 s) and act on it. Never raises: whatever a
        record holds is a candidate's, and the build goes on."""
        now = time.monotonic()
        if self._asked or now < self._next_poll:
            return
        self._next_poll = now + _POLL_S
        try:
            records = sorted(self.entry.glob(f"ext/*/*{'.cuhost' if self.cuda else '.pch'}.json"))
        except OSError:
            return
        for record in records:
            self._asked = True
            try:
                self._start(record)
            except Exception as exc:  # noqa: BLE001 - a candidate's file, judged here
                self.outcome = f"not made: {type(exc).__name__}: {exc}"
                self._release()
            return

    def _start(self, record: Path) -> None:
        try:
            flags, state = _read_request(record)
        except ValueError as exc:
            self.outcome = f"refused: an unreadable request ({exc})"
            return
        if state in ("unmatched", "failed"):  # a CUDA compile that compiled without it
            self.outcome = state
            return
        if state == "used":  # checked by the compile that used it: only its time is kept
            used = self.store / self._key(flags)
            if used.is_dir() and not used.is_symlink():
                os.utime(used)
            self.outcome = "used"
            return
        reason = self._refusal(flags)
        if reason is not None:
            self.outcome = f"refused: {reason}"
            return
        key = self._key(flags)
        folder = self.store / key
        if self._ready(folder):
            self.outcome = "ready"
            return
        failed = self.store / ".failed" / key
        if failed.exists() and time.time() - failed.stat().st_mtime < FAILED_TTL_S:
            self.outcome = "not made: it failed within the last hour"
            return
        (self.store / ".locks").mkdir(parents=True, exist_ok=True)
        self._lock = open(self.store / ".locks" / f"{key}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.outcome = "being made by another build"
            self._release()
            return
        if self._ready(folder):  # made while we looked
            self.outcome = "ready"
            self._release()
            return
        staging_root = self.store / ".staging"
        for left in staging_root.glob(f"{key}.*"):  # of a maker that died, under this lock
            shutil.rmtree(left, ignore_errors=True)
        staging = staging_root / f"{key}.{os.getpid()}"
        (staging if self.cuda else (staging / pch_cxx.GCH).parent).mkdir(parents=True)
        self._staging, self._folder, self._flags = staging, folder, flags
        env = dict(self.env, TMPDIR=str(staging), KERNELJUDGE_PCH_HEADER=str(header_path()))
        env["KERNELJUDGE_CXX"] = real_compiler()
        with open(staging / "make.log", "wb") as log:
            argv = ["kerneljudge.build.pch_cxx", "--precompile", str(staging / pch_cxx.GCH)]
            if self.cuda:
                argv = ["kerneljudge.build.pch_cuda", "--precompile", str(staging)]
            self._proc = confine.spawn_in(staging, argv + flags, log, env)
        self._started = time.monotonic()
        self.outcome = "being made"

    def finish(self, deadline: float | None = math.inf) -> str:
        """Wait for the header being made until ``deadline`` (a :func:`time.monotonic` time;
        at most :data:`PCH_TIMEOUT_S` after it started) and install it; ``deadline`` None:
        stop making it (the build ran out of time). Returns what happened: ``"made"``,
        ``"ready"`` (it was there), ``"none asked for"``, ``"refused: ..."``, ``"being made
        by another build"``, ``"not made: ..."``."""
        if deadline is not None:
            self._next_poll = 0.0
            self.poll()  # a record left just before the build ended
        proc = self._proc
        if proc is None:
            self._release()
            return self.outcome
        limit = 0.0
        if deadline is not None:
            limit = min(deadline, self._started + PCH_TIMEOUT_S) - time.monotonic()
        if not exits.exited(proc, max(0.0, limit)):  # not reaped: its group is its own
            self.outcome = "not made: it ran out of time"
        elif proc.poll() != 0:
            status = exits.exit_status(proc.returncode)
            self.outcome = f"not made: the compiler failed (exit status {status}): " + _last_line(
                self._staging
            )
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        try:
            if self.outcome == "being made":
                self._install()
                self.outcome = "made"
            elif deadline is not None:  # failed or too slow: not tried again for a while
                (self.store / ".failed").mkdir(exist_ok=True)
                assert self._folder is not None
                (self.store / ".failed" / self._folder.name).write_bytes(b"")
        except OSError as exc:
            self.outcome = f"not made: {exc}"
        finally:
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)
            self._release()
        log = _log.warning if self.outcome.startswith("not made") else _log.info
        log("precompiled header asked for by %s: %s", self.entry.name, self.outcome)
        return self.outcome

    def _key(self, flags: list[str]) -> str:
        if self.cuda:  # the salt the build's compiles keyed their variant with
            return pch_cuda.variant_key(flags, self.env.get("KERNELJUDGE_CUDA_PCH_SALT", ""))
        return pch_cxx.variant_key(flags, salt())

    def _refusal(self, flags: list[str]) -> str | None:
        if self.cuda:
            from kerneljudge.build import pch_nvcc

            return pch_nvcc.nvcc_refusal(flags)
        return refusal(flags)

    def _ready(self, folder: Path) -> bool:
        if self.cuda:
            return pch_cuda.state_of(str(folder))[0] == "ready"
        return pch_cxx.state_of(str(folder)) == "ready"

    def _install(self) -> None:
        assert self._staging is not None and self._folder is not None
        if self.cuda:
            from kerneljudge.build import pch_nvcc

            salt_ = self.env.get("KERNELJUDGE_CUDA_PCH_SALT", "")
            pch_nvcc.write_manifest(self._staging, self._flags, salt_)
            self._place(self._staging, self._folder)
            return
        gch = self._staging / pch_cxx.GCH
        os.symlink(header_path(), self._staging / pch_cxx.LINK)
        manifest = {
            "header": str(header_path()),
            "sha256": pch_cxx.digest(str(gch)),
            "size": gch.stat().st_size,
            "flags": self._flags,
            "salt": salt(),
        }
        (self._staging / pch_cxx.MANIFEST).write_text(json.dumps(manifest, indent=1))
        (self._staging / "make.log").unlink(missing_ok=True)
        gch.chmod(0o444)
        self._place(self._staging, self._folder)

    def _place(self, staging: Path, folder: Path) -> None:
        """Move a made variant into the store, replacing a damaged one and evicting the least
        recently used beyond :func:`max_variants`."""
        if folder.exists():  # damaged: never used, replaced
            _remove(folder)
        kept = variants(self.store)
        for old in kept[: max(0, len(kept) - max_variants() + 1)]:
            _remove(old)  # least recently used first
        os.rename(staging, folder)
        self._staging = None

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing drops the flock
            self._lock = None
