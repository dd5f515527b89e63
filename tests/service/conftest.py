"""The service's tests: real ``kerneljudge serve`` processes (uvicorn) on loopback, real SQLite,
real judging of the smoke problem on the CPU (timing off: cheap jobs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="install kerneljudge[serve]")
pytest.importorskip("uvicorn", reason="install kerneljudge[serve]")
httpx = pytest.importorskip("httpx", reason="install kerneljudge[serve]")

from kerneljudge.executors.base import Job  # noqa: E402
from kerneljudge.judge.options import JudgeOptions  # noqa: E402

SMOKE = Path(__file__).resolve().parents[1] / "fixtures" / "smoke"
SRC = Path(__file__).resolve().parents[2] / "src"
GOOD = (SMOKE / "candidate.py").read_text()
WRONG = GOOD.replace("torch.ones_like(x)", "torch.ones_like(x) + 1.0")
CRASH = GOOD.replace("return torch.addcmul", 'raise RuntimeError("boom")\n        return 0 *')
HANG = GOOD.replace("return torch.addcmul", "while True:\n            pass\n        return 0 *")
OPTIONS = JudgeOptions(device="cpu", trials=2, timing=False)
TOKEN = "test-token-0123456789"
#: Seconds a server may take to answer its first health check (a loaded 2-core machine).
START_TIMEOUT_S = 120.0


def smoke_job(source: str = GOOD, **kw: object) -> Job:
    """A job on the smoke problem (named relative to the server's --problems-dir)."""
    return Job(problem="problem.py", source=source, options=kw.pop("options", OPTIONS), **kw)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A ``kerneljudge serve`` process on loopback."""

    db: Path
    args: list[str] = field(default_factory=list)
    token: str | None = TOKEN
    port: int = field(default_factory=free_port)
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        env = dict(os.environ, PYTHONPATH=str(SRC))
        env.pop("KERNELJUDGE_TOKEN", None)
        cmd = [sys.executable, "-m", "kerneljudge", "serve", "--port", str(self.port)]
        cmd += ["--db", str(self.db), "--problems-dir", str(SMOKE), *self.args]
        if self.token:
            cmd += ["--token", self.token]
        log = self.log or self.db.with_suffix(".log")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {log.read_text()}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server did not answer in {START_TIMEOUT_S} s: {log.read_text()}")

    def kill(self) -> None:
        """SIGKILL (no clean-up of any kind)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 60 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a test module: one CPU slot, one job in flight, small limits."""
    db = tmp_path_factory.mktemp("service") / "jobs.sqlite"
    args = ["--cpu-slots", "1", "--max-in-flight", "1", "--max-queued", "20"]
    args += ["--max-per-client", "10", "--max-batch", "4"]
    srv = Server(db, args).start()
    yield srv
    srv.stop()
