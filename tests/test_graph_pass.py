"""The graph pass's arithmetic, its verdict fields and their plumbing, on the CPU (the replays
themselves are tested in tests/gpu/test_graph_timing_gpu.py)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
import torch

from kerneljudge import JudgeConfig
from kerneljudge.env.rewards import SpeedupReward
from kerneljudge.errors import ConfigError
from kerneljudge.judge.options import JudgeOptions
from kerneljudge.timing.graph_pass import HOST_DRIFT, _note, host_range, host_share
from kerneljudge.verdict import (
    GraphTiming,
    Measurement,
    Speedup,
    Status,
    TimingResult,
    Verdict,
)
from kerneljudge.verdict.render import graph_lines
from kerneljudge.worker import graphs
from kerneljudge.worker.forward import Fault
from kerneljudge.worker.graphs import NotCapturable, capture, signature
from kerneljudge.worker.replies import CaptureReply, MalformedReply


def _m(name: str, median: float) -> Measurement:
    return Measurement(name, 20, median, median, median, median, median, (median, median))


def _timing(eager_ms: float, cand_ms: float, graph: GraphTiming | None = None) -> TimingResult:
    sp = eager_ms / cand_ms
    return TimingResult(
        clock="cuda_event",
        measurements=(_m("eager", eager_ms), _m("candidate", cand_ms)),
        speedups=(Speedup("eager", sp, (sp * 0.99, sp * 1.01)),),
        rounds=10,
        stop_reason="precision",
        graph=graph,
    )


def test_host_share_is_the_launched_time_the_device_waited() -> None:
    assert host_share(4.0, 1.0) == pytest.approx(0.75)
    assert host_share(1.0, 1.0) == 0.0
    assert host_share(1.0, 1.2) == 0.0  # a replay slower than the launch: clipped
    assert host_share(0.0, 1.0) == 0.0


def test_host_range_by_hand() -> None:
    # eager: 4 ms launched, 1 ms of device: 3 ms of host; candidate: 0.5 ms, all device.
    lo, hi = host_range((4.0, 1.0), (0.5, 0.5), drift=2.0)
    assert (lo, hi) == pytest.approx(((1 + 1.5) / 0.5, (1 + 6) / 0.5))
    # both all device: the speedup does not move.
    assert host_range((2.0, 2.0), (1.0, 1.0)) == pytest.approx((2.0, 2.0))
    # both host-bound: each side's host part is scaled on its own, against the other's.
    lo, hi = host_range((3.0, 1.0), (1.0, 0.5), drift=2.0)
    assert (lo, hi) == pytest.approx(((1 + 1) / (0.5 + 1.0), (1 + 4) / (0.5 + 0.25)))
    # a replay slower than the launch counts as no host time.
    assert host_range((2.0, 2.5), (1.0, 1.0), drift=2.0) == pytest.approx((2.0, 2.0))
    assert HOST_DRIFT == pytest.approx(math.sqrt(1.75))


def test_note_only_when_the_speedup_moves_past_two_percent() -> None:
    launched = _timing(4.0, 0.5)
    moving = _note({"eager": 0.75, "candidate": 0.0}, {"eager": (5.0, 14.0)}, launched)
    assert "moves with the host" in moving and "75%" in moving and "eager" in moving
    assert _note({"eager": 0.0}, {"eager": (7.95, 8.05)}, launched) == ""


def test_graph_timing_round_trips_through_json() -> None:
    graph = GraphTiming(
        measurements=(_m("eager", 1.0), _m("candidate", 0.5)),
        speedups=(Speedup("eager", 2.0, (1.9, 2.1)),),
        rounds=9,
        stop_reason="precision",
        not_captured={"compile": "the forward raised while it was captured: x"},
        host_share={"eager": 0.75, "candidate": 0.0},
        host_range={"eager": (5.0, 14.0)},
        host_drift=HOST_DRIFT,
        note="n",
        capture_s={"eager": 0.1, "candidate": 0.2},
        seconds=1.5,
    )
    v = Verdict(Status.CORRECT, "", "p", "sha", "cuda", timing=_timing(4.0, 0.5, graph))
    back = Verdict.from_json(v.to_json())
    assert back == v
    assert back.timing.graph.host_range["eager"] == (5.0, 14.0)  # a tuple again, not a list


def test_graph_lines_say_both_speedups_shares_and_reasons() -> None:
    graph = GraphTiming(
        speedups=(Speedup("eager", 2.0, (1.9, 2.1)),),
        host_share={"eager": 0.75, "candidate": 0.1},
        note="the speedup over eager moves",
        not_captured={"compile": "raised"},
    )
    text = "\n".join(graph_lines(_timing(4.0, 0.5, graph)))
    assert "graph replay: speedup over eager 2.000x" in text
    assert "eager 75%" in text and "candidate 10%" in text
    assert "the speedup over eager moves" in text and "compile: not timed (raised)" in text
    assert graph_lines(_timing(4.0, 0.5)) == []


def test_reward_takes_the_replays_speedup_when_asked_and_measured() -> None:
    graph = GraphTiming(speedups=(Speedup("eager", 2.0, (1.9, 2.1)),))
    with_graph = Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing(16.0, 1.0, graph))
    without = Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing(16.0, 1.0))
    launch, replay = SpeedupReward(), SpeedupReward(timing="graph")
    assert launch(with_graph) == pytest.approx(1.0)  # 16x launched
    assert replay(with_graph) == pytest.approx(0.5 + 0.5 * math.log(2) / math.log(16))
    assert replay(without) == pytest.approx(1.0)  # no replays: the launched calls' speedup
    with pytest.raises(ValueError, match="timing"):
        SpeedupReward(timing="device")


def test_graph_timing_option_is_checked_and_carried() -> None:
    assert JudgeConfig().graph_timing is True
    with pytest.raises(ConfigError, match="graph_timing"):
        JudgeConfig(graph_timing="yes")  # type: ignore[arg-type]
    opts = JudgeOptions.from_dict({"graph_timing": False})
    assert opts.judge_config().graph_timing is False
    assert JudgeOptions.from_dict(opts.to_dict()) == opts


def test_capture_needs_a_cuda_device_and_says_so() -> None:
    with pytest.raises(NotCapturable, match="CUDA"):
        capture(lambda x: x + 1, [torch.ones(3)], torch.device("cpu"))


class _Capturer(graphs.CapturedCalls):
    """The capture handler alone, on a CPU stand-in for a GPU worker."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.model = lambda x: x + 1
        self.compiled = None
        self.sets = [[torch.ones(4)]]
        self.graphs = {}

    def _confined(self) -> Any:
        return contextlib.nullcontext()

    def _check_output(self, out: Any) -> None:
        pass


def test_no_room_for_a_capture_is_a_refusal_not_a_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    # The static copies of an 8 GiB input set ran out of device memory on the H200 while the
    # reference worker held the rest: the verdict must go on with launched timing alone.
    released: list[bool] = []

    def no_room(*args: Any, **kwargs: Any) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")

    monkeypatch.setattr(graphs, "capture", no_room)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(True))
    worker = _Capturer()
    reply = worker.op_capture({"target": "candidate"})
    assert reply["captured"] is False
    assert reply["reason"].startswith("out of memory while capturing")
    assert released and worker.graphs == {}
    CaptureReply.decode(reply, "candidate")  # a well-formed reply

    def exits(*args: Any, **kwargs: Any) -> None:
        raise SystemExit(3)

    monkeypatch.setattr(graphs, "capture", exits)  # anything else from the forward stays a fault
    with pytest.raises(Fault, match="capturing the forward failed: SystemExit"):
        worker.op_capture({"target": "candidate"})


def test_signature_binds_shapes_layouts_and_values() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 2).t()
    assert signature([a, 1]) == signature([torch.zeros(2, 3), 1])
    assert signature([a, 1]) != signature([a, 2])
    assert signature([a]) != signature([b])  # same shape, other strides


def test_capture_reply_is_decoded_strictly() -> None:
    ok = CaptureReply.decode({"captured": True, "reason": "", "capture_s": 0.5}, "candidate")
    assert ok.captured and ok.capture_s == 0.5
    long = CaptureReply.decode(
        {"captured": False, "reason": "x\n" * 600, "capture_s": 0}, "candidate"
    )
    assert len(long.reason) <= 500 and "\n" not in long.reason
    with pytest.raises(MalformedReply):
        CaptureReply.decode({"captured": 1, "reason": "", "capture_s": 0.5}, "candidate")


def test_static_outputs_are_filled_so_an_unwritten_element_is_wrong() -> None:
    from kerneljudge.worker.measure import load_static, unwritten

    scalar = torch.tensor(1.5)
    strided = torch.zeros(4, 6)[:, ::2]
    ints = torch.zeros(3, dtype=torch.int32)
    uints = torch.zeros(3, dtype=torch.uint8)
    flags = torch.zeros(2, dtype=torch.bool)
    static_in = torch.zeros(3)
    load_static([static_in, 7], [scalar, strided, ints, uints, flags], [torch.ones(3), 7])
    assert torch.isnan(scalar) and torch.isnan(strided).all()
    assert (ints == -1).all() and (uints == 255).all() and flags.all()
    assert torch.equal(static_in, torch.ones(3))  # the inputs are copied after the fill
    assert unwritten(torch.zeros(1, dtype=torch.int64)) == -1


def test_reward_does_not_pay_for_refusing_capture() -> None:
    # launched: eager 16 ms, candidate 1 ms (16x); replays: eager 2 ms; candidate not captured.
    graph = GraphTiming(
        measurements=(_m("eager", 2.0),),
        not_captured={"candidate": "the forward does something a capture forbids"},
    )
    v = Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing(16.0, 1.0, graph))
    assert SpeedupReward(timing="graph")(v) == pytest.approx(0.5 + 0.5 * math.log(2) / math.log(16))
    assert SpeedupReward()(v) == pytest.approx(1.0)  # the launched speedup, as asked
    # No baseline replayed either: the launched speedup.
    bare = GraphTiming(not_captured={"candidate": "x", "eager": "y"})
    v2 = Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing(16.0, 1.0, bare))
    assert SpeedupReward(timing="graph")(v2) == pytest.approx(1.0)


def test_speedups_of_baselines_timed_alone_are_none() -> None:
    from kerneljudge.timing import speedups

    assert speedups({"eager": [1.0, 1.1, 0.9]}) == []


def test_capture_reply_time_must_be_finite() -> None:
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(MalformedReply):
            CaptureReply.decode({"captured": True, "reason": "", "capture_s": bad}, "candidate")


def test_replay_intervals_are_at_least_two_percent_wide() -> None:
    from kerneljudge.timing.graph_pass import floored

    narrow = floored(Speedup("eager", 10.0, (9.99, 10.01), (9.99, 10.01), None))
    assert narrow.ci95 == pytest.approx((9.8, 10.2)) and narrow.ci95_samples == (9.99, 10.01)
    wide = floored(Speedup("eager", 10.0, (8.0, 13.0)))
    assert wide.ci95 == (8.0, 13.0)


def test_the_report_shows_the_replays() -> None:
    from kerneljudge.suite.htmlreport.candidate import _timing as report_timing

    graph = GraphTiming(
        speedups=(Speedup("eager", 2.0, (1.9, 2.1)),),
        host_share={"eager": 0.75},
        host_range={"eager": (5.0, 14.0)},
        not_captured={"compile": "a <sync>"},
    )
    html = report_timing(Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing_of(graph)))
    assert "Graph replays" in html and "2x" in html and "5-14" in html and "75%" in html
    assert "a &lt;sync&gt;" in html  # escaped
    assert "Graph replays" not in report_timing(
        Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing_of(None))
    )


def _timing_of(graph: GraphTiming | None) -> TimingResult:
    return _timing(4.0, 0.5, graph)


def test_the_one_line_summary_names_the_replay_speedup() -> None:
    from kerneljudge.verdict.render import verdict_summary

    graph = GraphTiming(speedups=(Speedup("eager", 2.5, (2.4, 2.6)),))
    line = verdict_summary(Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing_of(graph)))
    assert line.startswith("correct p: 8.00x vs eager") and "replay 2.50x" in line
    plain = verdict_summary(Verdict(Status.CORRECT, "", "p", "s", "cuda", timing=_timing_of(None)))
    assert "replay" not in plain
