"""Request limits that follow the problem (:mod:`kerneljudge.check.limits`): derived from the
reference's measured call, between a floor and a cap, unless ``run_timeout_s`` is given."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status, Verdict
from kerneljudge.candidate import Candidate
from kerneljudge.check import limits as limits_module
from kerneljudge.check.limits import (
    CAP_S,
    FACTOR,
    FIRST_CALL_FLOOR_S,
    FLOOR_S,
    LOAD_FLOOR_S,
    REFERENCE_FLOOR_S,
    REFERENCE_S_PER_GIB,
    TRANSFER_S_PER_GIB,
    RunLimits,
    tensor_bytes,
)
from kerneljudge.errors import ConfigError
from kerneljudge.judge.options import JudgeOptions

SMOKE = Path(__file__).parent / "fixtures" / "smoke" / "problem.py"
GIB = 1 << 30

HANG = Candidate.from_source(
    "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        while True:\n            pass\n",
    name="hang.py",
)
#: Correct on its first call, then hangs: the hang is in a later trial.
HANG_LATER = Candidate.from_source(
    "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    "    calls = 0\n\n"
    "    def forward(self, x):\n"
    "        ModelNew.calls += 1\n"
    "        while ModelNew.calls > 1:\n            pass\n"
    "        return torch.addcmul(torch.ones_like(x), x, torch.full_like(x, 2.0))\n",
    name="hang_later.py",
)
DOUBLE = Candidate.from_source(
    "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return x * 2.0\n",
    name="double.py",
)

#: A reference that sleeps SLEEP_S in every call (the float64 oracle calls it too).


def _config(tmp_path: Path, **changes: object) -> JudgeConfig:
    base: dict[str, object] = {
        "device": "cpu",
        "trials": 2,
        "timing": False,
        "threads": 1,
        "cache_dir": tmp_path / "cache",
    }
    return JudgeConfig(**{**base, **changes})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the rule


def test_the_floor_holds_for_a_fast_reference() -> None:
    rule = RunLimits()
    assert rule.run_s(0.0, 0) == FLOOR_S
    assert rule.run_s(1e-5, 4 << 10) == FLOOR_S
    assert rule.for_set([0.003, 0.001, 0.002], 128).run_s == FLOOR_S
    assert rule.for_set([], 0).reference_call_s == 0.0


def test_the_limit_grows_with_the_reference_and_the_bytes_moved() -> None:
    rule = RunLimits()
    assert rule.run_s(0.5, 0) == pytest.approx(FACTOR * 0.5)
    assert rule.run_s(0.5, 2 * GIB) == pytest.approx(FACTOR * 0.5 + 2 * TRANSFER_S_PER_GIB)
    # The least of the runs is the reference's call: a first call's warm-up is not scaled.
    got = rule.for_set([3.0, 0.4, 0.5], GIB)
    assert got.reference_call_s == 0.4
    assert got.run_s == pytest.approx(FACTOR * 0.4 + TRANSFER_S_PER_GIB)


def test_the_cap_holds_for_a_slow_reference() -> None:
    rule = RunLimits()
    assert rule.run_s(60.0, 0) == CAP_S
    assert rule.run_s(1e6, 0) == CAP_S
    # The transfer of a big problem's tensors comes on top of the capped calls.
    assert rule.run_s(60.0, 2 * GIB) == pytest.approx(CAP_S + 2 * TRANSFER_S_PER_GIB)


def test_an_explicit_limit_wins_over_the_derived_one() -> None:
    rule = RunLimits(explicit_s=7.0)
    assert rule.source == "explicit" and RunLimits().source == "derived"
    for call, moved in ((0.0, 0), (60.0, 0), (0.5, 50 * GIB)):
        assert rule.run_s(call, moved) == 7.0
    assert rule.load_s([rule.for_set([0.5], 0)]) == 7.0
    # The reference's own requests get at least the explicit limit, and what its bytes need.
    assert RunLimits(explicit_s=900.0).reference_s(0) == 900.0
    assert rule.reference_s(0) == REFERENCE_FLOOR_S


def test_the_reference_limit_follows_the_bytes_it_moves() -> None:
    rule = RunLimits()
    assert rule.reference_s(0) == REFERENCE_FLOOR_S
    assert rule.reference_s(6 * GIB) == pytest.approx(REFERENCE_FLOOR_S + 6 * REFERENCE_S_PER_GIB)
    # A 6 GiB problem (KernelBench's 19_ReLU) gets far more than the 120 s every request had.
    assert rule.reference_s(6 * GIB) > 2 * 120.0
    small, big = rule.for_set([0.01], 1 << 20), rule.for_set([0.01], 6 * GIB)
    assert big.reference_s > small.reference_s >= small.run_s
    assert rule.load_s([small]) == LOAD_FLOOR_S


def test_tensor_bytes_counts_nested_tensors() -> None:
    x = torch.zeros(4, 8)  # 128 bytes
    assert tensor_bytes([x, (x, 3), {"w": x.double()}, "s"]) == 128 * 2 + 256


# ---------------------------------------------------------------- configuration


def test_run_timeout_defaults_to_derived_and_checks_a_given_value() -> None:
    assert JudgeConfig().run_timeout_s is None
    assert JudgeOptions().run_timeout_s is None
    assert JudgeOptions.from_dict({"run_timeout_s": None}).judge_config().run_timeout_s is None
    assert JudgeOptions.from_dict({"run_timeout_s": 30}).judge_config().run_timeout_s == 30
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ConfigError, match="run_timeout_s"):
            JudgeConfig(run_timeout_s=bad)  # type: ignore[arg-type]
    data = JudgeOptions().to_dict()
    assert data["run_timeout_s"] is None
    assert JudgeOptions.from_dict(json.loads(json.dumps(data))) == JudgeOptions()


# ---------------------------------------------------------------- verdicts


def test_a_hang_in_a_small_problem_ends_at_the_floor_and_an_explicit_limit_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first-call floor lowered from 120 s for the test's time (read where limits are set)
    monkeypatch.setattr(limits_module, "FIRST_CALL_FLOOR_S", 30.0)
    with Judge(SMOKE, _config(tmp_path)) as j:
        v = j.evaluate(HANG)
        assert v.status is Status.TIMEOUT, v.reason
        limits = v.limits
        assert limits is not None and limits.source == "derived"
        assert limits.run_s["public"] == FLOOR_S < 30.0  # not the former 120 s
        # the hang is in the first trial, whose call may compile: the first-call floor
        assert "within 30 s" in v.reason and FIRST_CALL_FLOOR_S == 120.0, v.reason
        assert limits.reference_call_s["public"] > 0
        assert limits.reference_s["public"] >= REFERENCE_FLOOR_S
        assert (limits.floor_s, limits.cap_s, limits.factor) == (FLOOR_S, CAP_S, FACTOR)
        later = j.evaluate(HANG_LATER)  # a later trial's call compiles nothing: the floor
        assert later.status is Status.TIMEOUT, later.reason
        assert f"within {FLOOR_S:g} s" in later.reason, later.reason
        with j.configured(run_timeout_s=7.0):
            explicit = j.evaluate(HANG)
        assert explicit.status is Status.TIMEOUT, explicit.reason
        assert explicit.limits is not None and explicit.limits.source == "explicit"
        assert explicit.limits.run_s == {"public": 7.0} and explicit.limits.load_s == 7.0
        assert "within 7 s" in explicit.reason
    again = Verdict.from_json(v.to_json())
    assert again.limits == v.limits


def test_a_slower_reference_gets_a_longer_limit(
    tmp_path: Path, slow_reference_problem: Callable[[float], Path]
) -> None:
    """A reference of 0.5 s a call (1 s a trial run with its float64 oracle) gives the
    candidate at least 100 x 0.5 s per request; an honest candidate is correct."""
    problem = slow_reference_problem(0.5)
    with Judge(problem, _config(tmp_path)) as j:
        v = j.evaluate(DOUBLE)
    assert v.status is Status.CORRECT, v.reason
    assert v.limits is not None and v.limits.source == "derived"
    assert v.limits.reference_call_s["public"] >= 0.5
    assert v.limits.run_s["public"] >= FACTOR * 0.5 > FLOOR_S
    assert v.limits.run_s["public"] <= CAP_S
    assert v.limits.load_s >= v.limits.run_s["public"]


def test_an_old_verdict_without_limits_still_loads() -> None:
    old = {
        "status": "correct",
        "reason": "",
        "problem": "p",
        "candidate_sha256": "0" * 64,
        "backend": "torch",
        "stage_s": {"build": 0.1},
        "schema_version": "1.3",
    }
    v = Verdict.from_dict(old)
    assert v.limits is None and v.status is Status.CORRECT
    assert v.schema_version == "1.3"
