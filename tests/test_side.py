"""A candidate's outputs sent straight to the reference worker on a pipe of their own
(kerneljudge.worker.side, kerneljudge.check.beside): descriptors handed over by label, a whole
message read with the channel's checks, and every way the outputs fail to arrive answered at
once, never as outputs."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import torch

from kerneljudge import Judge, JudgeConfig, Status
from kerneljudge.worker.protocol import Channel
from kerneljudge.worker.side import SidePipe, hand_over, recv_outputs, send_outputs, take_handed


class _Worker:
    """The hand-over end a :class:`SidePipe` needs of a worker, and the worker's own end."""

    def __init__(self) -> None:
        self.sup, self.end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    def hand_over(self, fd: int, token: bytes) -> None:
        hand_over(self.sup, fd, token)


def test_descriptors_are_taken_by_label_and_stale_ones_closed() -> None:
    sup, end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    hand_over(sup, r1, b"old-one!")
    hand_over(sup, r2, b"wanted!!")
    fd = take_handed(end, b"wanted!!")
    os.write(w2, b"x")
    assert os.read(fd, 1) == b"x"
    # The stale descriptor of the earlier transfer was closed on the way.
    os.close(w1)
    with pytest.raises(RuntimeError, match="no pipe"):
        take_handed(end, b"old-one!")
    for x in (fd, r1, w2):
        os.close(x)


def test_outputs_cross_whole_and_a_finished_pipe_answers_at_once() -> None:
    reader, writer = _Worker(), _Worker()
    outputs = [torch.randn(300_000), torch.arange(10)]
    got: dict[str, object] = {}
    with SidePipe(reader, writer) as pipe:
        thread = threading.Thread(
            target=lambda: got.update(r=recv_outputs(reader.end, pipe.token, 30.0, 1 << 30))
        )
        thread.start()
        send_outputs(writer.end, pipe.token, outputs)
        thread.join()
    received, why, failed = got["r"]  # type: ignore[misc]
    assert why == "" and not failed and all(torch.equal(a, b) for a, b in zip(received, outputs))

    # Nothing written: the supervisor's closing message ends the wait, as "no outputs".
    with SidePipe(reader, writer) as pipe:
        take_handed(writer.end, pipe.token)  # the candidate's end, never written
        thread = threading.Thread(
            target=lambda: got.update(r=recv_outputs(reader.end, pipe.token, 30.0, 1 << 30))
        )
        thread.start()
        pipe.finish()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert got["r"] == (None, "it sent no outputs", False)


def test_kept_outputs_on_the_host_are_sent_as_they_are_and_cross_whole() -> None:
    """An audited call's kept outputs on the host are the worker's own copies: sent without a
    copy of their bytes (the same storage goes into the pipe), lists and tuples kept, what is
    no tensor still refused as :func:`to_cpu` refuses it; the reader gets them whole."""
    from kerneljudge.worker.forward import Fault, as_sent

    outputs = [torch.randn(300_000), (torch.arange(10), None)]
    sent = as_sent(outputs)
    assert isinstance(sent, list) and isinstance(sent[1], tuple)
    assert sent[0].data_ptr() == outputs[0].data_ptr() and sent[1][1] is None
    with pytest.raises(Fault):
        as_sent([{"not": "a tensor"}])
    reader, writer = _Worker(), _Worker()
    got: dict[str, object] = {}
    with SidePipe(reader, writer) as pipe:
        thread = threading.Thread(
            target=lambda: got.update(r=recv_outputs(reader.end, pipe.token, 30.0, 1 << 30))
        )
        thread.start()
        send_outputs(writer.end, pipe.token, outputs[0:1] + [outputs[1][0]], as_sent)
        thread.join()
    received, why, failed = got["r"]  # type: ignore[misc]
    assert why == "" and not failed
    assert torch.equal(received[0], outputs[0]) and torch.equal(received[1], outputs[1][0])


def test_cut_corrupt_large_and_late_outputs_are_not_outputs() -> None:
    reader = _Worker()

    def transfer(payload: bytes, max_bytes: int = 1 << 30, timeout_s: float = 5.0) -> str:
        r, w = os.pipe()
        token = os.urandom(8)
        reader.hand_over(r, token)
        os.close(r)
        os.write(w, payload)
        os.close(w)
        received, why, failed = recv_outputs(reader.end, token, timeout_s, max_bytes)
        assert received is None and not failed
        return why

    whole = _message({"outputs": [torch.ones(4)]})
    assert "whole" in transfer(whole[: len(whole) // 2])  # cut short, writer gone
    assert "whole" in transfer(b"\x00" * 8 + b"\xff" * 64)  # a corrupt header
    assert "exceed" in transfer(whole, max_bytes=16)
    r, w = os.pipe()
    reader.hand_over(r, b"late....")
    os.close(r)
    assert "within" in recv_outputs(reader.end, b"late....", 0.2, 1 << 30)[1]
    os.close(w)


def _message(message: dict) -> bytes:
    r, w = os.pipe()
    Channel(-1, w).send(message)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    return data


CLOSES_ITS_SOCKETS = '''
import os
import torch
import torch.nn as nn


def _close_sockets():
    """Close every socket of this worker: the hand-over socket its pipes come on among them."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                os.close(int(name))
        except OSError:
            pass


class ModelNew(nn.Module):
    def forward(self, x):
        _close_sockets()
        return x * 2.0 + 1.0
'''


def test_a_candidate_that_closes_its_pipes_socket_is_not_judged_correct(tmp_path: Path) -> None:
    """Candidate code that closes the worker's hand-over socket (so the pipe its outputs were
    to go on never reaches it) gets no comparison it could pass: the verdict is a failure, and
    the reference worker, which waited for those outputs, answers the next verdict."""
    smoke = Path(__file__).parent / "fixtures" / "smoke"
    cand = tmp_path / "steal.py"
    cand.write_text(CLOSES_ITS_SOCKETS)
    config = JudgeConfig(
        device="cpu", cache_dir=tmp_path / "c", timing=False, run_timeout_s=30.0, threads=1
    )
    with Judge(smoke / "problem.py", config) as judge:
        verdict = judge.evaluate(cand)
        assert verdict.status is Status.RUNTIME_ERROR, verdict.reason
        assert "the worker failed on run" in verdict.reason, verdict.reason
        honest = judge.evaluate(smoke / "candidate.py")
    assert honest.status is Status.CORRECT, honest.reason


@pytest.mark.parametrize("shown", [None, 3, [torch.ones(2), "x"]])
def test_outputs_that_are_not_a_list_of_tensors_are_answered_not_raised(shown: object) -> None:
    """An audited call's outputs that are not a list of plain tensors: the reference worker
    answers (no digests, ``n_outputs`` -1) rather than failing on them."""
    from kerneljudge.worker.kept_trials import KeptTrials

    kept = KeptTrials()
    kept.role, kept.device = "reference", torch.device("cpu")
    kept.expected = {"audit": {"outputs": torch.ones(2), "oracle": None}}
    kept.held = {}
    sup, kept.handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    r, w = os.pipe()
    hand_over(sup, r, b"audit-01")
    os.close(r)
    Channel(-1, w).send({"outputs": shown})
    os.close(w)
    reply = kept.op_compare(
        {
            "key": "audit",
            "side": b"audit-01".hex(),
            "side_timeout_s": 5.0,
            "atol": 1e-3,
            "rtol": 1e-3,
            "mode": "allclose",
            "forget": True,
            "digest_kinds": [1],
        }
    )
    assert reply["n_outputs"] == -1 and reply["tensors"] is False and "digests" not in reply
    assert reply["trial"]["passed"] is False
