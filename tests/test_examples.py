"""The bundled examples are fixtures: each must get the status its header declares.

On the CPU this judges the C++ examples of ``causal_gqa`` (four real C++ builds, shared through
the test build cache); the GPU tier judges all of them.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kerneljudge.cli.examples import find_examples, run_examples
from kerneljudge.cli.output import make_console
from kerneljudge.verdict import Status


def test_every_example_declares_status_and_backend() -> None:
    examples = find_examples()
    assert {e.problem for e in examples} >= {
        "causal_gqa",
        "mla_kv_projection",
        "triangle_attention",
    }
    for e in examples:
        assert e.backend in ("cuda", "cpp", "triton", "torch"), e.path
        if e.expected is Status.COMPILE_ERROR:
            assert e.compile_error_line, f"{e.path} must declare its compile-error line"


@pytest.mark.slow
def test_cpu_examples_of_causal_gqa_get_their_status(shared_cache: Path) -> None:
    out = io.StringIO()  # a log file: every row whole, one plain line each
    results = run_examples(
        problem="causal_gqa",
        device="cpu",
        cache_dir=shared_cache,
        max_time_s=0.5,
        console=make_console(file=out),
    )
    assert {r.example.path.name for r in results} >= {
        "cpp_reference.py",
        "cpp_wrong.py",
        "cpp_crash.py",
        "cpp_hang.py",
    }
    for r in results:
        assert r.as_expected, (r.example.path.name, r.verdict.status, r.verdict.reason)
    log = out.getvalue().splitlines()
    for r in results:
        row = next(ln for ln in log if ln.startswith(f"causal_gqa  {r.example.path.name} "))
        assert row.rstrip().endswith(r.verdict.reason), row
    assert "…" not in out.getvalue()
