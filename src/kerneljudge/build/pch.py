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
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import IO

from kerneljudge.build import pch_cxx, toolchain
from kerneljudge.worker import confine

__all__ = ["PCH_TIMEOUT_S", "Precompiler", "environment", "refusal", "salt", "store_dir"]

_log = logging.getLogger(__name__)

#: Longest a variant's header may take to make (seconds from the start); about 60 s on one
#: core of the 2-core development VM (docs/benchmarks/2026-12-02-cpu-precompiled-header.md).
PCH_TIMEOUT_S = 600.0
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
    "-fdiagnostics-format",
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


@functools.cache
def salt() -> str:
    """SHA-256 of what a header's bytes depend on besides the options: the build protocol,
    torch (version, git revision, header path), the real compiler (path and ``--version``),
    Python and the machine."""
    import torch

    real = real_compiler()
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
    wrapper with ``store``."""
    return {
        "CXX": str(toolchain.PCH_WRAPPER),
        "KERNELJUDGE_CXX": real_compiler(),
        "KERNELJUDGE_PYTHON": sys.executable,
        "KERNELJUDGE_PCH_DIR": str(store),
        "KERNELJUDGE_PCH_SALT": salt(),
        "KERNELJUDGE_PCH_HEADER": str(header_path()),
    }


@functools.cache
def _trusted_roots() -> tuple[str, ...]:
    roots = [str(header_path().parents[1])]  # torch's include folder
    for name in ("include", "platinclude"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.append(os.path.realpath(path))
    home = toolchain.cuda_home()
    if home:
        roots.append(os.path.realpath(os.path.join(home, "include")))
        roots.append(os.path.realpath(os.path.join(home, "targets")))
    return tuple(roots)


def _trusted_dir(path: str) -> bool:
    real = os.path.realpath(path)
    return os.path.isabs(path) and any(
        real == root or real.startswith(root + os.sep) for root in _trusted_roots()
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


class Precompiler:
    """Makes, at most once per build, the header variant a compile of that build asked for.

    :meth:`poll` (called while the build runs) finds the first request a compile left in the
    build's extension folders and, when its options are safe and the store lacks that variant
    (or holds it damaged), starts making it; :meth:`finish` waits for it and installs it.
    Only one process makes a variant at a time (a lock file per key): a build that finds it
    being made starts nothing.

    Args:
        store: the store folder (:func:`store_dir`).
        entry: the build's cache entry (its ``ext/`` holds the requests).
        env: the build worker's environment (the maker runs with it).
    """

    def __init__(self, store: Path, entry: Path, env: dict[str, str]) -> None:
        self.store, self.entry, self.env = store, entry, env
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
        """Look for a request (at most every 0.25 s) and start making what it asks for."""
        now = time.monotonic()
        if self._asked or now < self._next_poll:
            return
        self._next_poll = now + _POLL_S
        for request in sorted(self.entry.glob("ext/*/*.pch.json")):
            self._asked = True
            try:
                self._start(request)
            except OSError as exc:
                self.outcome = f"not made: {exc}"
                self._release()
            return

    def _start(self, request: Path) -> None:
        try:
            with open(request, "rb") as f:
                asked = json.loads(f.read(_REQUEST_LIMIT))
            flags = asked["flags"]
            if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            self.outcome = "refused: an unreadable request"
            return
        reason = refusal(flags)
        if reason is not None:
            self.outcome = f"refused: {reason}"
            return
        key = pch_cxx.variant_key(flags, salt())
        folder = self.store / key
        if pch_cxx.state_of(str(folder)) == "ready":
            self.outcome = "ready"
            return
        if (self.store / ".failed" / key).exists():
            self.outcome = "not made: the compiler failed on it before"
            return
        (self.store / ".locks").mkdir(parents=True, exist_ok=True)
        self._lock = open(self.store / ".locks" / f"{key}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.outcome = "being made by another build"
            self._release()
            return
        if pch_cxx.state_of(str(folder)) == "ready":  # made while we looked
            self.outcome = "ready"
            self._release()
            return
        staging = self.store / ".staging" / f"{key}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / pch_cxx.GCH).parent.mkdir(parents=True)
        env = dict(self.env, TMPDIR=str(staging), KERNELJUDGE_PCH_HEADER=str(header_path()))
        env["KERNELJUDGE_CXX"] = real_compiler()
        with open(staging / "make.log", "wb") as log:
            argv = ["kerneljudge.build.pch_cxx", "--precompile", str(staging / pch_cxx.GCH)]
            self._proc = confine.spawn_in(staging, argv + flags, log, env)
        self._staging, self._folder, self._flags = staging, folder, flags
        self._started = time.monotonic()
        self.outcome = "being made"

    def finish(self, wait: bool = True) -> str:
        """Wait for the header being made (up to :data:`PCH_TIMEOUT_S` from its start) and
        install it; ``wait`` False: stop making it (the build ran out of time). Returns what
        happened: ``"made"``, ``"ready"`` (it was there), ``"none asked for"``, ``"refused:
        ..."``, ``"being made by another build"``, ``"not made: ..."``."""
        if wait:
            self._next_poll = 0.0
            self.poll()  # a request left just before the build ended
        proc = self._proc
        if proc is None:
            return self.outcome
        try:
            limit = self._started + PCH_TIMEOUT_S - time.monotonic() if wait else 0.0
            proc.wait(max(0.0, limit))
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is None:
            self.outcome = (
                f"not made: it took more than {PCH_TIMEOUT_S:g} s"
                if wait
                else "not made: the build ran out of time"
            )
        elif proc.returncode != 0:
            self.outcome = f"not made: the compiler failed (exit status {proc.returncode})"
            if confine.exit_status(proc.returncode) == 1:  # the compiler's own error
                failed = self.store / ".failed"  # options the header does not compile with
                failed.mkdir(exist_ok=True)
                assert self._folder is not None
                (failed / self._folder.name).write_bytes(b"")
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the group is still its own
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if self.outcome == "being made":
            try:
                self._install()
                self.outcome = "made"
            except OSError as exc:
                self.outcome = f"not made: {exc}"
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
        self._release()
        _log.info("precompiled header for %s: %s", self.entry.name, self.outcome)
        return self.outcome

    def _install(self) -> None:
        assert self._staging is not None and self._folder is not None
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
        if self._folder.exists():  # damaged: never used, replaced
            trash = self._folder.with_name(f".trash-{self._folder.name}.{os.getpid()}")
            os.rename(self._folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(self._staging, self._folder)
        self._staging = None

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing drops the flock
            self._lock = None
