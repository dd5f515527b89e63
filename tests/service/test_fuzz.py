"""API fuzzing from the service's own OpenAPI document (schemathesis): requests generated
from every operation's schema, valid and not, against the app with an executor that judges
for real. No answer is a 5xx, every answer has a documented status code, and none takes
long (a request that hangs fails the test)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="install kerneljudge[dev]")
hypothesis = pytest.importorskip("hypothesis")

from kerneljudge.executors.local import LocalExecutor  # noqa: E402
from kerneljudge.service.app import create_app  # noqa: E402
from kerneljudge.service.core import JudgeService, Limits  # noqa: E402
from kerneljudge.service.store import JobStore  # noqa: E402

from .conftest import SMOKE, TOKEN  # noqa: E402

#: Examples per operation: the whole run stays within about two minutes here.
EXAMPLES = 40
#: The longest one answer may take, seconds (``wait`` is capped by the schema at 60 s, and
#: fuzzed job ids name no job, so no answer waits).
SLOW_S = 30.0


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JudgeService]:
    db = tmp_path_factory.mktemp("fuzz") / "jobs.sqlite"
    store = JobStore(db)
    svc = JudgeService(
        store,
        lambda: LocalExecutor(devices=[], cpu_slots=1),
        limits=Limits(max_queued=50, max_per_client=50, max_batch=8, max_body_bytes=1 << 20),
        problems_dir=Path(SMOKE),
        max_in_flight=1,
    )
    svc.start()
    yield svc
    svc.close()
    store.close()


@pytest.fixture(scope="module")
def fuzz_schema(service: JudgeService):  # type: ignore[no-untyped-def]
    app = create_app(service, token=TOKEN)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("fuzz_schema")


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)
def test_no_server_errors_and_no_hangs(case) -> None:  # type: ignore[no-untyped-def]
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import status_code_conformance

    start = time.monotonic()
    case.call_and_validate(
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[not_a_server_error, status_code_conformance],
    )
    assert time.monotonic() - start < SLOW_S, "a request took too long"
