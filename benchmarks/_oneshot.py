"""Running one measurement in a fresh Python process, for the benchmarks that keep each
verdict's process its own: the child prints one line ``RESULT <json>``; the parent reads it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """This process's environment with this checkout's ``src`` first on ``PYTHONPATH``: what a
    benchmark's child process runs with."""
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def run_one(
    cmd: list[str], timeout_s: float, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` with this checkout's ``src`` first on ``PYTHONPATH`` (and ``extra_env``)
    and return the JSON of its last ``RESULT`` line; without one, ``{"seconds": None,
    "status": ..., "reason": ...}`` (``timeout`` after ``timeout_s`` seconds, else ``exit N``
    and its output's last lines)."""
    env = {**child_env(), **(extra_env or {})}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"seconds": None, "status": "timeout", "reason": f"over {timeout_s} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"seconds": None, "status": f"exit {proc.returncode}", "reason": " | ".join(tail)}
    out: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return out
