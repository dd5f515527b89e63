"""``kerneljudge eval`` finds a local ``kerneljudge serve`` through its discovery file and judges
through it; a stale file (the service gone) or a service that cannot judge the request leaves
eval judging in its own process. A real server process on loopback (no token), real evals in
subprocesses, the state folder a temporary one (``KERNELJUDGE_STATE_DIR``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.judge import JudgeConfig
from kerneljudge.service.cli import local_service_eval
from kerneljudge.service.client import JudgeClient
from kerneljudge.service.discovery import discovery_path, find_local_service, service_problem

from .conftest import SMOKE, SRC, Server, free_port

EVAL_TIMEOUT_S = 600.0  # one eval on a loaded machine, in-process workers included


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's state folder, in this process's environment (the server inherits it)."""
    folder = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELJUDGE_STATE_DIR", str(folder))
        mp.setenv("KERNELJUDGE_HEALTH_TIMEOUT", "60")  # a loaded machine answers slowly
        yield folder


@pytest.fixture(scope="module")
def local_server(state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("discovery") / "jobs.sqlite"
    srv = Server(db, ["--cpu-slots", "1", "--max-in-flight", "1"], token=None).start()
    yield srv
    srv.stop()


def _eval(*extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("KERNELJUDGE_TOKEN", None)
    cmd = [sys.executable, "-m", "kerneljudge", "eval", "--problem", str(SMOKE / "problem.py")]
    cmd += [str(SMOKE / "candidate.py"), "--device", "cpu", "--trials", "2", "--no-timing"]
    cmd += ["--json", *extra]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=EVAL_TIMEOUT_S, check=False
    )


def _done(server: Server) -> int:
    with JudgeClient(server.url, timeout_s=120.0) as client:
        return int(client.metrics()["states"]["done"])


def test_serve_records_where_it_listens(local_server: Server, state: Path) -> None:
    path = discovery_path()
    assert path.parent == state
    record = json.loads(path.read_text())
    assert local_server.proc is not None
    assert record["pid"] == local_server.proc.pid and record["port"] == local_server.port
    assert record["host"] == "127.0.0.1" and record["token_required"] is False
    assert record["problems_dir"] == str(SMOKE.resolve()) and record["started_at"] > 0
    assert path.stat().st_mode & 0o777 == 0o600
    found = find_local_service()
    assert found is not None and found.url == local_server.url
    assert found.pid == local_server.proc.pid and found.problems_dir == SMOKE.resolve()


def test_eval_without_server_judges_through_the_local_service(local_server: Server) -> None:
    before = _done(local_server)
    run = _eval()
    assert run.returncode == 0, run.stderr
    note = f"kerneljudge: judging through the local service at {local_server.url}"
    assert note in run.stderr
    assert json.loads(run.stdout)["status"] == "correct"
    assert _done(local_server) == before + 1  # the service judged it

    local = _eval("--local")  # forced in-process: the service judges nothing more
    assert local.returncode == 0, local.stderr
    assert "local service" not in local.stderr
    assert json.loads(local.stdout)["status"] == "correct"
    assert _done(local_server) == before + 1


def test_a_request_the_service_cannot_judge_stays_in_process(
    local_server: Server, tmp_path: Path
) -> None:
    config = JudgeConfig(device="cpu", trials=2, timing=False)
    from kerneljudge.candidate import Candidate

    cand = Candidate.from_file(SMOKE / "candidate.py")
    notes: list[str] = []
    problem = str(SMOKE / "problem.py")
    # an option a job cannot carry
    assert (
        local_service_eval(problem, cand, config, "public", {"--seed": 3}, None, notes.append)
        is None
    )
    assert notes[-1] == (
        f"judging in this process: --seed is not carried to the local service at {local_server.url}"
    )
    # a problem file outside the service's folder
    elsewhere = tmp_path / "problem.py"
    elsewhere.write_text((SMOKE / "problem.py").read_text())
    assert service_problem(str(elsewhere), SMOKE) is None
    assert service_problem(str(SMOKE / "problem.py"), SMOKE) == "problem.py"
    assert service_problem("causal_gqa", None) == "causal_gqa"
    assert (
        local_service_eval(str(elsewhere), cand, config, "public", {}, None, notes.append) is None
    )
    assert notes[-1].endswith(f"cannot load {elsewhere} (not under its folder)")
    # a record that says a token is needed, and none given
    path = discovery_path()
    saved = path.read_text()
    try:
        path.write_text(json.dumps({**json.loads(saved), "token_required": True}))
        assert local_service_eval(problem, cand, config, "public", {}, None, notes.append) is None
        assert notes[-1].endswith("needs a token (KERNELJUDGE_TOKEN or --token)")
    finally:
        path.write_text(saved)


def test_broken_and_unanswered_records_are_ignored(local_server: Server) -> None:
    path = discovery_path()
    saved = path.read_text()
    try:
        for text in ("", "{", "[]", '{"host": "127.0.0.1"}', '{"host": 1, "port": "x"}'):
            path.write_text(text)
            assert find_local_service() is None
        record = json.loads(saved)
        # a live process (this one) and a port nobody listens on
        path.write_text(json.dumps({**record, "pid": os.getpid(), "port": free_port()}))
        assert find_local_service(timeout_s=5.0) is None
        # something that is not an HTTP service listens there
        with socket.create_server(("127.0.0.1", 0)) as listener:

            def answer() -> None:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(1024)
                    conn.sendall(b"not http at all\r\n\r\n")

            thread = threading.Thread(target=answer, daemon=True)
            thread.start()
            port = listener.getsockname()[1]
            path.write_text(json.dumps({**record, "pid": os.getpid(), "port": port}))
            assert find_local_service(timeout_s=30.0) is None
            thread.join(30)
        # not a loopback address
        path.write_text(json.dumps({**record, "host": "10.1.2.3"}))
        assert find_local_service() is None
    finally:
        path.write_text(saved)
    assert find_local_service() is not None


def test_a_stopped_service_leaves_eval_judging_in_process(local_server: Server) -> None:
    path = discovery_path()
    record = path.read_text()
    local_server.stop()  # SIGTERM: a clean exit removes its record
    assert not path.exists()
    path.write_text(record)  # what a crash leaves: the record of a dead process
    assert find_local_service() is None
    run = _eval()
    assert run.returncode == 0, run.stderr
    assert "local service" not in run.stderr and "Traceback" not in run.stderr
    assert json.loads(run.stdout)["status"] == "correct"
