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
EXAMPLES = 100
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


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_no_server_errors_and_no_hangs(service: JudgeService, mode: str) -> None:
    """Every operation, ``EXAMPLES`` generated requests each: fitting the schema (positive)
    or not (negative)."""
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import status_code_conformance

    app = create_app(service, token=TOKEN)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 7
    calls = 0

    for operation in operations:

        @hypothesis.given(case=operation.as_strategy(GenerationMode(mode)))
        @hypothesis.settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
            database=None,
        )
        def fuzz(case) -> None:  # type: ignore[no-untyped-def]
            nonlocal calls
            start = time.monotonic()
            case.call_and_validate(
                headers=auth, checks=[not_a_server_error, status_code_conformance]
            )
            took = time.monotonic() - start
            assert took < SLOW_S, f"{case.method} {case.formatted_path} took {took:.0f} s"
            calls += 1

        bare = not (operation.path_parameters or operation.query or operation.body)
        if mode == "negative" and bare:
            continue  # nothing to break in a request without parameters or body
        fuzz()
    assert calls >= len(operations)
