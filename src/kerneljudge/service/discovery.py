"""Where a local ``kerneljudge serve`` listens: a small discovery file that ``serve`` writes at
its start and removes at its clean exit, and that ``kerneljudge eval`` reads to judge through
the warm service instead of starting its own workers.

The file is ``serve.json`` in the state folder: ``$KERNELJUDGE_STATE_DIR``, else
``$XDG_STATE_HOME/kerneljudge``, else ``~/.local/state/kerneljudge``. It holds ``host``,
``port``, ``pid``, ``started_at`` (Unix seconds), ``token_required`` and ``problems_dir`` (the
service's ``--problems-dir``, absolute, or null). It is written atomically (a temporary file
renamed over it), readable by its owner only. A file whose process is dead, whose host is not
a loopback address, or whose service does not answer ``/v1/health`` within a short time is
ignored: nothing here raises for a stale or broken file.

Standard library only (``urllib`` for the health check): ``eval`` reads it without the
``serve`` extra.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LocalService",
    "discovery_path",
    "find_local_service",
    "health_timeout_s",
    "remove_record",
    "service_problem",
    "state_dir",
    "write_record",
]

#: Seconds ``eval`` waits for a discovered service's health answer (``KERNELJUDGE_HEALTH_TIMEOUT``).
DEFAULT_HEALTH_TIMEOUT_S = 1.0
FILE_NAME = "serve.json"


def state_dir() -> Path:
    """The folder of the discovery file (see the module docstring); not created here."""
    explicit = os.environ.get("KERNELJUDGE_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "kerneljudge"


def discovery_path() -> Path:
    """``state_dir() / "serve.json"``."""
    return state_dir() / FILE_NAME


def health_timeout_s() -> float:
    """``$KERNELJUDGE_HEALTH_TIMEOUT`` in seconds (a bad or missing value: 1.0)."""
    try:
        value = float(os.environ.get("KERNELJUDGE_HEALTH_TIMEOUT", DEFAULT_HEALTH_TIMEOUT_S))
    except ValueError:
        return DEFAULT_HEALTH_TIMEOUT_S
    return value if value > 0 else DEFAULT_HEALTH_TIMEOUT_S


def write_record(
    host: str, port: int, token_required: bool, problems_dir: Path | None
) -> Path | None:
    """Write this process's service record (atomically, mode 0600); its path, or None when
    the state folder cannot be written (the service runs on, undiscoverable)."""
    path = discovery_path()
    record = {
        "host": host,
        "port": int(port),
        "pid": os.getpid(),
        "started_at": time.time(),
        "token_required": bool(token_required),
        "problems_dir": str(problems_dir.resolve()) if problems_dir is not None else None,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".serve-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return None
    return path


def remove_record(path: Path | None) -> None:
    """Remove the record at ``path`` when it is still this process's (a later service may
    have written its own over it); never raises."""
    if path is None:
        return
    record = _read(path)
    if record is not None and record.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass(frozen=True)
class LocalService:
    """A running loopback service found through the discovery file.

    Attributes:
        url: ``http://host:port``.
        pid: the service's process id.
        token_required: the service wants ``Authorization: Bearer``.
        problems_dir: its ``--problems-dir`` (absolute), or None.
        queue_depth: jobs queued there when its health was asked.
    """

    url: str
    pid: int
    token_required: bool
    problems_dir: Path | None
    queue_depth: int


def find_local_service(timeout_s: float | None = None) -> LocalService | None:
    """The service the discovery file names, when its process lives, its host is a loopback
    address and it answers ``GET /v1/health`` with ``status: ok`` within ``timeout_s``
    seconds (None: :func:`health_timeout_s`); otherwise None. Never raises."""
    from kerneljudge.service.cli import is_loopback

    record = _read(discovery_path())
    if record is None:
        return None
    try:
        host, port, pid = str(record["host"]), int(record["port"]), int(record["pid"])
        token_required = bool(record.get("token_required", False))
        folder = record.get("problems_dir")
    except (KeyError, TypeError, ValueError):
        return None
    if not is_loopback(host) or not 0 < port < 65536 or not _alive(pid):
        return None
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    health = _health(url, timeout_s if timeout_s is not None else health_timeout_s())
    if health is None:
        return None
    depth = health.get("queue_depth")
    return LocalService(
        url=url,
        pid=pid,
        token_required=token_required,
        problems_dir=Path(folder) if isinstance(folder, str) and folder else None,
        queue_depth=depth if isinstance(depth, int) else 0,
    )


def service_problem(spec: str, problems_dir: Path | None) -> str | None:
    """``eval``'s ``--problem`` as the local service knows it: a bundled name as it is, a file
    under the service's ``problems_dir`` by its path relative to that folder; None when the
    service cannot load it (a file elsewhere, or no such problem)."""
    from kerneljudge.errors import KernelJudgeError
    from kerneljudge.problem import bundled_problem_names, resolve_problem

    try:
        path = resolve_problem(spec)
    except KernelJudgeError:
        return None
    if spec in bundled_problem_names() and not Path(spec).exists():
        return spec
    if problems_dir is None:
        return None
    try:
        relative = path.resolve().relative_to(problems_dir.resolve())
    except (OSError, ValueError):
        return None
    return relative.as_posix()


def _read(path: Path) -> dict[str, Any] | None:
    """The record at ``path``; None unless it is this user's file that no one else may write
    (a record another user could write would send this user's candidates and token where it
    says)."""
    try:
        st = path.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not the service that wrote the record
        return False
    except OSError:
        return False
    return True


def _health(url: str, timeout_s: float) -> dict[str, object] | None:
    request = urllib.request.Request(url + "/v1/health", headers={"Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(request, timeout=timeout_s) as answer:
            body = json.loads(answer.read(65536).decode("utf-8"))
    except (OSError, ValueError, http.client.HTTPException, urllib.error.URLError):
        return None  # refused, timed out, not HTTP, not JSON
    if not isinstance(body, dict) or body.get("status") != "ok":
        return None
    return body
