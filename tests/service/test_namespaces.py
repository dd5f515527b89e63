"""Job ids per client, through a real ``kerneljudge serve``: without a token a client names
itself (``X-Client-Id``, default ``anonymous``) and sees, waits for and cancels only its own
jobs; the same id sent by two clients is two jobs, judged side by side without meeting in the
executor; per-client queue limits count each client's own jobs. With a token the client is
the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kerneljudge.service.store import JobStore

from .conftest import GOOD, TOKEN, WRONG, Server, httpx, smoke_job

#: Seconds to wait for a verdict on this loaded machine.
WAIT_S = 300.0


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server without a token (loopback): clients name themselves."""
    db = tmp_path_factory.mktemp("namespaces") / "jobs.sqlite"
    args = ["--cpu-slots", "1", "--max-in-flight", "2", "--max-per-client", "2"]
    srv = Server(db, args, token=None).start()
    yield srv
    srv.stop()


def _as(srv: Server, name: str | None) -> httpx.Client:
    headers = {"X-Client-Id": name} if name is not None else {}
    return httpx.Client(base_url=srv.url, headers=headers, timeout=WAIT_S + 30)


def _result(http: httpx.Client, job_id: str) -> httpx.Response:
    answer = http.get(f"/v1/jobs/{job_id}/result", params={"wait": 60})
    while answer.status_code == 202:
        answer = http.get(f"/v1/jobs/{job_id}/result", params={"wait": 60})
    return answer


def test_one_id_two_clients_two_jobs(open_server: Server) -> None:
    alice, bob, carol, anonymous = (_as(open_server, n) for n in ("alice", "bob", "carol", None))
    good = smoke_job(GOOD, job_id="shared-1")
    wrong = smoke_job(WRONG, job_id="shared-1")
    first = alice.post("/v1/jobs", json=good.to_dict())
    second = bob.post("/v1/jobs", json=wrong.to_dict())
    assert (first.status_code, second.status_code) == (202, 202), second.text
    assert first.json()["created"] and second.json()["created"]  # no 409: not the same job
    # Each client's idempotency key is its own: a repeat is its job, other content is 409.
    assert alice.post("/v1/jobs", json=good.to_dict()).json()["created"] is False
    assert bob.post("/v1/jobs", json=wrong.to_dict()).json()["created"] is False
    assert alice.post("/v1/jobs", json=wrong.to_dict()).status_code == 409
    # Each sees its own job under the id; anyone else gets the answer for an unknown id.
    assert alice.get("/v1/jobs/shared-1").json()["source_sha256"] == good.source_sha256
    assert bob.get("/v1/jobs/shared-1").json()["source_sha256"] == wrong.source_sha256
    for stranger in (carol, anonymous):
        answer = stranger.get("/v1/jobs/shared-1")
        assert answer.status_code == 404 and answer.json()["detail"] == "no job 'shared-1'"
        assert stranger.get("/v1/jobs/shared-1/result").status_code == 404
        assert stranger.delete("/v1/jobs/shared-1").status_code == 404
    # Both were judged, each with its own source (the executor never took one for the other).
    assert _result(alice, "shared-1").json()["verdict"]["status"] == "correct"
    assert _result(bob, "shared-1").json()["verdict"]["status"] == "incorrect"
    assert alice.get("/v1/jobs/shared-1").json()["state"] == "done"  # carol's cancel did nothing


def test_anonymous_is_a_client_and_names_are_checked(open_server: Server) -> None:
    anonymous, named = _as(open_server, None), _as(open_server, "anonymous")
    job = smoke_job(job_id="anon-1")
    assert anonymous.post("/v1/jobs", json=job.to_dict()).status_code == 202
    assert named.get("/v1/jobs/anon-1").json()["job_id"] == "anon-1"  # the default name
    assert _result(anonymous, "anon-1").json()["verdict"]["status"] == "correct"
    for bad in ("a b", "x" * 65, "a/b", ""):
        answer = _as(open_server, bad).get("/v1/jobs/anon-1")
        assert answer.status_code == 422 and "X-Client-Id" in answer.json()["detail"]


def test_per_client_limits_count_own_jobs(open_server: Server) -> None:
    dave, erin = _as(open_server, "dave"), _as(open_server, "erin")
    three = {"jobs": [smoke_job().to_dict() for _ in range(3)]}
    answer = dave.post("/v1/batches", json=three)
    assert answer.status_code == 429 and "at most 2" in answer.json()["detail"]
    two = [smoke_job(), smoke_job()]
    assert erin.post("/v1/batches", json={"jobs": [j.to_dict() for j in two]}).status_code == 202
    for job in two:
        assert _result(erin, job.job_id).json()["state"] == "done"


def test_with_a_token_the_token_is_the_client(server: Server) -> None:
    """The shared test server (with a token): ``X-Client-Id`` is not read."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    job = smoke_job()
    with httpx.Client(base_url=server.url, headers=auth, timeout=60) as http:
        answer = http.post("/v1/jobs", json=job.to_dict(), headers={"X-Client-Id": "alice"})
        assert answer.status_code == 202
        seen = http.get(f"/v1/jobs/{job.job_id}", headers={"X-Client-Id": "a b"})
        assert seen.status_code == 200 and seen.json()["job_id"] == job.job_id
        assert http.delete(f"/v1/jobs/{job.job_id}").status_code in (200, 409)


def test_the_store_scopes_reads_and_cancels_by_client(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.sqlite")
    job = smoke_job(job_id="same")
    store.add([(job, job.problem)], "name:a", 100, 100)
    store.add([(smoke_job(WRONG, job_id="same"), "p")], "name:b", 100, 100)
    a, b = store.get("same", "name:a"), store.get("same", "name:b")
    assert a is not None and b is not None and a.seq != b.seq and a.run_id != b.run_id
    assert store.get("same", "name:c") is None
    assert not store.cancel_queued("same", "name:c")
    assert store.cancel_queued("same", "name:b")
    assert store.get("same", "name:a").state == "queued"  # type: ignore[union-attr]
    claimed = store.claim_next()
    assert claimed is not None and claimed.seq == a.seq and claimed.client == "name:a"
    assert claimed.job().source == GOOD
    store.close()
