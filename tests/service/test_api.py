"""The service's HTTP behaviour against a real ``kerneljudge serve`` process: submit, status,
result, cancel, health, metrics; 401, 404, 409, 422, 429; idempotent job ids; problems
outside the server's folder refused; the clients' one-line errors."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kerneljudge.executors.base import JobError
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.service.client import (
    AsyncJudgeClient,
    AuthError,
    ConflictError,
    InvalidJobError,
    JudgeClient,
    NotFoundError,
    QueueFullError,
    ServiceError,
    _q,
)
from kerneljudge.verdict import Status

from .conftest import CRASH, GOOD, HANG, SMOKE, SRC, TOKEN, WRONG, Server, smoke_job

WAIT_S = 300.0  # a verdict on a loaded machine: generous
#: One plain request's limit: httpx's default (5 s) is too short for a host loaded to 10x its
#: cores, where the server's fsync'd writes and its event loop wait for a core.
_post = functools.partial(httpx.post, timeout=120.0)
_get = functools.partial(httpx.get, timeout=120.0)


@pytest.fixture()
def client(server: Server) -> JudgeClient:
    with JudgeClient(server.url, token=TOKEN) as c:
        yield c


def test_health_is_open_and_everything_else_needs_the_token(server: Server) -> None:
    assert _get(server.url + "/v1/health").json()["status"] == "ok"
    assert _get(server.url + "/openapi.json").json()["openapi"].startswith("3.")
    with JudgeClient(server.url) as anonymous, pytest.raises(AuthError, match="^401: "):
        anonymous.metrics()
    with JudgeClient(server.url, token=TOKEN + "x") as wrong, pytest.raises(AuthError):
        wrong.submit(smoke_job())
    answer = _post(server.url + "/v1/jobs", json=smoke_job().to_dict())
    assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
    answer = _post(
        server.url + "/v1/jobs",
        json=smoke_job().to_dict(),
        headers={"Authorization": f"Basic {TOKEN}"},
    )
    assert answer.status_code == 401


def test_submit_status_result_and_metrics(client: JudgeClient) -> None:
    good, wrong, crash = smoke_job(GOOD), smoke_job(WRONG), smoke_job(CRASH)
    statuses = client.submit_batch([good, wrong, crash])
    assert [s["job_id"] for s in statuses] == [good.job_id, wrong.job_id, crash.job_id]
    assert all(s["created"] and s["state"] in ("queued", "running") for s in statuses)
    verdict = client.result(good.job_id, wait=WAIT_S)
    assert verdict.status is Status.CORRECT, verdict.reason
    assert verdict.problem == "smoke_affine" and verdict.candidate_sha256 == good.source_sha256
    assert client.result(wrong.job_id, wait=WAIT_S).status is Status.INCORRECT
    assert client.result(crash.job_id, wait=WAIT_S).status is Status.RUNTIME_ERROR
    status = client.status(good.job_id)
    assert status["state"] == "done" and status["attempts"] == 1
    assert status["finished_at"] >= status["started_at"] >= status["submitted_at"]
    metrics = client.metrics()
    assert metrics["states"]["done"] >= 3 and metrics["queue_depth"] >= 0
    assert set(metrics) >= {"busy_share", "verdicts_per_s", "in_flight", "states"}


def test_same_job_id_is_one_job(client: JudgeClient) -> None:
    job = smoke_job(GOOD)
    first = client.submit(job)
    again = client.submit(job)
    assert first["created"] and not again["created"]
    assert again["submitted_at"] == first["submitted_at"]
    batch = client.submit_batch([job, job])
    assert [s["created"] for s in batch] == [False, False]
    with pytest.raises(ConflictError, match="already names another job"):
        client.submit(dataclasses.replace(job, source=WRONG))
    client.result(job.job_id, wait=WAIT_S)
    assert client.status(job.job_id)["attempts"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"problem": "/etc/passwd"}, "bundled problem name or a .py file under"),
        ({"problem": "../smoke/../../conftest.py"}, "bundled problem name"),
        ({"problem": str(SMOKE / "problem.py")}, "bundled problem name"),
        ({"options": {"cache_dir": "/tmp/x"}}, "cache_dir is set by the server"),
        ({"options": {"trials": 0}}, "trials"),
        ({"options": {"colour": "red"}}, "unknown option 'colour'"),
        ({"options": {"timing": "yes"}}, "timing must be true or false"),
        ({"source": ""}, "job.source must be a non-empty string"),
        ({"job_id": "a/b"}, "job.job_id is 1 to 128 of"),
        ({"job_id": "."}, "not '.' or '..'"),
        ({"job_id": ".."}, "not '.' or '..'"),
        ({"name": "../x.py"}, "job.name is a file name"),
        ({"source": "x" * ((1 << 20) + 1)}, "larger than"),
    ],
)
def test_bad_jobs_are_refused_with_one_line(
    client: JudgeClient, change: dict[str, object], message: str
) -> None:
    data = smoke_job().to_dict() | change
    with pytest.raises(InvalidJobError, match="^422: ") as caught:
        client.submit(data)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(NotFoundError):
        client.status(data["job_id"]) if "/" not in data["job_id"] else client.status("nope")
    if data["job_id"] in (".", ".."):  # the client sends a dot segment as %2E: not resolved away
        url = client._http.build_request("GET", f"/v1/jobs/{_q(data['job_id'])}/result").url
        assert url.raw_path == b"/v1/jobs/" + b"%2E" * len(data["job_id"]) + b"/result"


def test_malformed_bodies_get_one_line_422(server: Server) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    for body in (b"{", b"[]", b'{"problem": 1, "source": "x"}', b'{"jobs": 3}'):
        answer = _post(server.url + "/v1/jobs", content=body, headers=headers)
        assert answer.status_code == 422, body
        assert "\n" not in answer.json()["detail"]
    answer = _post(server.url + "/v1/jobs", content=b"{", headers=headers)
    assert answer.json()["detail"].startswith("request body is not valid JSON")
    # A batch over --max-batch (4) is refused on its length, before its jobs are read: these
    # jobs would each be refused for a missing source.
    answer = _post(server.url + "/v1/batches", json={"jobs": [{"problem": 1}] * 5}, headers=headers)
    assert answer.status_code == 422 and answer.json()["detail"] == "a batch holds at most 4 jobs"
    answer = _post(server.url + "/v1/batches", json={"jobs": []}, headers=headers)
    assert answer.status_code == 422
    big = b'{"problem": "problem.py", "source": "' + b"x" * (16 << 20) + b'"}'
    answer = _post(server.url + "/v1/jobs", content=big, headers=headers)
    assert answer.status_code == 413 and "larger than" in answer.json()["detail"]

    def chunks():  # no Content-Length: the limit counts the bytes as they come
        for _ in range(17):
            yield b"x" * (1 << 20)

    answer = _post(server.url + "/v1/jobs", content=chunks(), headers=headers, timeout=60)
    assert answer.status_code == 413


def test_full_queue_answers_429_with_retry_after(server: Server, client: JudgeClient) -> None:
    # A hanging job holds the server's one job in flight, so the queue cannot drain while the
    # limits are tried (on a quick machine it otherwise drains between two requests).
    hang = smoke_job(HANG, options=dataclasses.replace(_opts(), run_timeout_s=30.0))
    client.submit(hang)
    deadline = time.monotonic() + WAIT_S
    while client.status(hang.job_id)["state"] == "queued":
        assert time.monotonic() < deadline, "the hanging job never started"
        time.sleep(0.2)
    accepted: list[str] = []
    # The per-client limit (10 queued) is passed by the third batch of four at the latest.
    with pytest.raises(QueueFullError, match="^429: .*retry after") as caught:
        for _ in range(6):
            batch = client.submit_batch([smoke_job() for _ in range(4)])
            accepted += [s["job_id"] for s in batch]
    assert caught.value.retry_after_s >= 1 and len(accepted) <= 12
    jobs = [smoke_job().to_dict() for _ in range(4)]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answer = _post(server.url + "/v1/batches", json={"jobs": jobs}, headers=auth)
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    assert all(client.status(j)["state"] for j in accepted)  # the refused batch: none stored
    with pytest.raises(NotFoundError):
        client.status(jobs[0]["job_id"])
    answer = _post(server.url + "/v1/batches", json={"jobs": jobs * 2}, headers=auth)
    assert answer.status_code == 422 and "at most 4 jobs" in answer.json()["detail"]
    for job_id in accepted:  # make room for the next tests
        try:
            client.cancel(job_id)
        except ConflictError:
            pass  # started already


def test_cancel_a_queued_job_and_not_a_started_one(client: JudgeClient) -> None:
    hang = smoke_job(HANG, options=dataclasses.replace(_opts(), run_timeout_s=15.0))
    waiting = smoke_job(GOOD)
    client.submit(hang)
    deadline = time.monotonic() + WAIT_S
    while client.status(hang.job_id)["state"] != "running":
        assert time.monotonic() < deadline, "the hanging job never started"
        time.sleep(0.2)
    client.submit(waiting)  # one job in flight at a time: this one stays queued
    answer = client.cancel(waiting.job_id)
    assert answer == {"job_id": waiting.job_id, "cancelled": True, "state": "cancelled"}
    with pytest.raises(JobError, match="cancelled") as caught:
        client.result(waiting.job_id)
    assert caught.value.kind == "cancelled"
    with pytest.raises(ConflictError, match="too late to cancel"):
        client.cancel(hang.job_id)
    assert client.result(hang.job_id, wait=WAIT_S).status is Status.TIMEOUT
    with pytest.raises(NotFoundError):
        client.cancel("no-such-job")
    with pytest.raises(TimeoutError):
        client.result(client.submit(smoke_job())["job_id"], wait=0)


def _opts() -> JudgeOptions:
    return JudgeOptions(device="cpu", trials=2, timing=False)


def test_async_client(server: Server) -> None:
    async def go() -> tuple[Status, dict[str, object]]:
        async with AsyncJudgeClient(server.url, token=TOKEN) as c:
            job = smoke_job(GOOD)
            await c.submit(job)
            verdict = await c.result(job.job_id, wait=WAIT_S)
            return verdict.status, await c.health()

    status, health = asyncio.run(go())
    assert status is Status.CORRECT and health["status"] == "ok"


def test_eval_server_prints_the_local_verdict(server: Server, tmp_path: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "kerneljudge", "eval", str(SMOKE / "candidate.py")]
        cmd += ["--device", "cpu", "--trials", "2", "--no-timing", "--json", *extra]
        env = {"PYTHONPATH": str(SRC), "KERNELJUDGE_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=WAIT_S)

    local = run("-p", str(SMOKE / "problem.py"), "--cache-dir", str(tmp_path))
    remote = run("-p", "problem.py", "--server", server.url)
    assert (local.returncode, remote.returncode) == (0, 0), remote.stderr

    # Same fields but for times (the reference's measured call among the limits too) and the
    # numbers of the trials' random inputs (the run seed is secret, so two local runs differ
    # there too).
    def stable(text: str) -> dict[str, object]:
        d = json.loads(text)
        check = d.pop("check")
        trials = [(t["index"], t["passed"], t["reason"]) for t in check.pop("trials")]
        build = {k: v for k, v in d.pop("build").items() if k not in ("duration_s", "cached")}
        d = {k: v for k, v in d.items() if k not in ("started_at", "finished_at", "duration_s")}
        del d["stage_s"], d["worker_log"]
        if d.get("limits"):  # the reference's measured call is a time
            d["limits"] = {k: v for k, v in d["limits"].items() if k != "reference_call_s"}
        return d | {"check": check, "trials": trials, "build": build}

    assert stable(remote.stdout) == stable(local.stdout)
    refused = run("-p", "problem.py", "--server", server.url, "--seed", "3")
    assert refused.returncode == 2 and "--seed is not available with --server" in refused.stderr


def test_serve_refuses_a_public_address_without_token(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kerneljudge", "serve", "--host", "0.0.0.0"]
    cmd += ["--db", str(tmp_path / "x.sqlite")]
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 without an API token" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.sqlite").exists()


def test_clients_refuse_bad_addresses_and_tokens_in_one_line() -> None:
    for cls in (JudgeClient, AsyncJudgeClient):
        with pytest.raises(ServiceError, match=r"^not a service address: 'http://\[::1'"):
            cls("http://[::1")
        with pytest.raises(ServiceError, match="API token must be printable ASCII"):
            cls("http://127.0.0.1:1", token="t\u00f6ken")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token", "t\u00f6ken"], "the API token must be printable ASCII"),
        (["--devices", "cuda:7"], "cuda:7 is not a GPU this process sees"),
        (["--port", "{busy}"], "cannot listen on 127.0.0.1:{busy}"),
    ],
)
def test_serve_refuses_bad_settings_at_start_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    with socket.socket() as busy:  # a port in use, for the last case
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = [a.format(busy=port) for a in args]
        cmd = [sys.executable, "-m", "kerneljudge", "serve", "--cpu-slots", "1", *args]
        cmd += ["--db", str(tmp_path / "x.sqlite")]
        env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message.format(busy=port) in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
