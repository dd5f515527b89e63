"""Outputs handed over on the device (kerneljudge.worker.vmm through kerneljudge.worker.side):
what the reference worker accepts of a message that says its outputs lie in device memory, what
it answers when the driver refuses them, and the supervisor's second request through the host.
The driver's part runs on the GPU (tests/gpu/test_vmm_gpu.py); here, with no GPU, every path
that decides something without it."""

from __future__ import annotations

import array
import os
import socket
import threading
from typing import Any

import pytest
import torch

from kerneljudge.check.beside import OutputsLost, outputs_beside, with_first_record
from kerneljudge.worker.protocol import Channel
from kerneljudge.worker.side import (
    SidePipe,
    hand_over,
    link_label,
    recv_outputs,
    send_outputs,
    take_handed,
)
from kerneljudge.worker.vmm import ALIGN, DEVICE_MIN_BYTES, device_message, span

_KEY = "__kerneljudge_device_tensor__"


class _Worker:
    """A hand-over socket as a worker has one: the supervisor's end and the worker's."""

    def __init__(self) -> None:
        self.sup, self.end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)

    def hand_over(self, fd: int, token: bytes) -> None:
        hand_over(self.sup, fd, token)


def test_tensors_are_placed_one_after_another_each_aligned() -> None:
    offsets, end = span([1, ALIGN, ALIGN + 1, 0, 3])
    assert offsets == [0, ALIGN, 2 * ALIGN, 4 * ALIGN, 4 * ALIGN]
    assert end == 5 * ALIGN
    assert all(o % ALIGN == 0 for o in offsets)


def test_host_tensors_take_the_device_path_only_from_a_gpu_worker() -> None:
    """Host tensors are sent on the device only where the sender names a CUDA device (a CPU
    worker's never are; the CUDA case is tests/gpu/test_vmm_gpu.py's)."""
    big = torch.zeros(DEVICE_MIN_BYTES // 4 + 1)
    assert device_message([big, None, 3], lambda v: v) == (None, None)
    assert device_message([big], lambda v: v, torch.device("cpu")) == (None, None)


def test_outputs_picked_for_the_device_are_let_go_without_the_cyclic_collector() -> None:
    """What ``device_message`` picked to send on the device is freed once the caller drops it,
    by reference counts alone: a closure that walked the outputs by calling itself kept them
    in a reference cycle, gigabytes of device memory per trial until the collector ran. (With
    no GPU the export fails and the message goes through the host; on a GPU it is closed.)"""
    import gc
    import weakref

    big = torch.zeros(DEVICE_MIN_BYTES // 4 + 1)
    gone = weakref.ref(big)
    gc.disable()
    try:
        message, export = device_message([[big], None], lambda v: v, torch.device("cuda:0"))
        if export is not None:
            export.close()
        del big, message, export
        assert gone() is None
    finally:
        gc.enable()


def test_a_pipe_carries_a_socket_for_device_memory_beside_it_and_host_outputs_still_cross() -> None:
    reader, writer = _Worker(), _Worker()
    outputs = [torch.randn(2000), 7, None]
    got: dict[str, Any] = {}
    with SidePipe(reader, writer) as pipe:
        thread = threading.Thread(
            target=lambda: got.update(r=recv_outputs(reader.end, pipe.token, 30.0, 1 << 30))
        )
        thread.start()
        # With a host copy given: no CUDA tensor here, so the message goes through the host.
        send_outputs(writer.end, pipe.token, outputs, to_host=lambda v: v)
        thread.join()
    received, why, failed = got["r"]
    assert why == "" and not failed
    assert torch.equal(received[0], outputs[0]) and received[1:] == [7, None]
    # Both ends of both descriptors were taken: nothing is left in either worker's queue.
    for worker in (reader, writer):
        with pytest.raises(RuntimeError):
            take_handed(worker.end, b"anything")


def _forged(message: dict[str, Any], fd: int | None = None, device: Any = "cuda") -> tuple:
    """What a reference worker on ``device`` answers to ``message`` written on a pipe, with
    ``fd`` sent on the socket beside it."""
    reader = _Worker()
    token = os.urandom(8)
    r, w = os.pipe()
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.hand_over(r, token)
    reader.hand_over(far.fileno(), link_label(token))
    os.close(r)
    far.close()
    if fd is not None:
        near.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    Channel(-1, w).send(message)
    os.close(w)
    dev = torch.device(device) if device is not None else None
    try:
        return recv_outputs(reader.end, token, 5.0, 1 << 30, dev)
    finally:
        near.close()


def _spec(i: int = 0, **change: Any) -> dict[str, Any]:
    spec = {_KEY: i, "dtype": "float32", "shape": [1 << 20], "offset": 0}
    spec.update(change)
    return spec


def test_malformed_device_placeholders_are_the_candidates_doing_never_a_driver_failure() -> None:
    size = 4 << 20
    r, w = os.pipe()
    try:
        cases = {
            "malformed": {"outputs": [_spec(dtype="object")], "device_bytes": size},
            "malformed ": {"outputs": [_spec(shape=[-1])], "device_bytes": size},
            "malformed  ": {"outputs": [_spec(extra=1)], "device_bytes": size},
            "out of place": {"outputs": [_spec(offset=ALIGN)], "device_bytes": size},
            "out of place ": {"outputs": [_spec(), _spec(1, offset=0)], "device_bytes": size},
            "allocation size": {"outputs": [_spec()], "device_bytes": 1 << 40},
            "allocation size ": {"outputs": [_spec()], "device_bytes": "4194304"},
            "exceed": {"outputs": [_spec(shape=[1 << 40])], "device_bytes": 1 << 42},
        }
        for expected, message in cases.items():
            received, why, failed = _forged(message, fd=r)
            assert received is None and not failed, expected
            assert expected.strip() in why, (expected, why)
        # No descriptor came beside the message.
        received, why, failed = _forged({"outputs": [_spec()], "device_bytes": size})
        assert (received, failed) == (None, False) and "no device memory came" in why
        # Device memory sent to a reference worker without a GPU.
        received, why, failed = _forged({"outputs": [_spec()], "device_bytes": size}, r, None)
        assert (received, failed) == (None, False) and "without a GPU" in why
    finally:
        os.close(r)
        os.close(w)


def test_a_descriptor_of_no_device_is_the_senders_doing() -> None:
    # A pipe, a socket or a regular file is no exported allocation, and is refused before the
    # driver sees it: no second request.
    r, w = os.pipe()
    a, b = socket.socketpair()
    message = {"outputs": [_spec(), 5], "device_bytes": 4 << 20}
    try:
        with open(__file__, "rb") as plain:
            for fd in (r, a.fileno(), plain.fileno()):
                received, why, failed = _forged(message, fd=fd, device="cuda:0")
                assert received is None and not failed, why
                assert "descriptor of no device" in why
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_a_device_descriptor_the_driver_refuses_is_a_device_failure_worth_asking_again() -> None:
    # A character device is what the driver's descriptors are; this one is no allocation, and
    # (no GPU here) there is no device to import it on: the driver's part failed.
    message = {"outputs": [_spec(), 5], "device_bytes": 4 << 20}
    with open(os.devnull, "rb") as null:
        received, why, failed = _forged(message, fd=null.fileno(), device="cuda:0")
    assert received is None and failed
    assert "could not be taken from the device" in why


def test_a_device_failure_is_asked_for_once_more_through_the_host() -> None:
    reference = _Worker()
    asked: list[dict[str, Any]] = []
    answers = [OutputsLost("refused", device_failed=True), [torch.ones(3)]]

    class _Candidate(_Worker):
        def request(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
            asked.append({"op": op, **fields})
            return {"side": True}

    def read(side: dict[str, Any]) -> Any:
        found = answers.pop(0)
        if isinstance(found, OutputsLost):
            raise found
        return found

    cand = _Candidate()
    got, found = outputs_beside(reference, cand, "run", 5.0, {"seed": 1}, read)  # type: ignore[arg-type]
    assert got == {"side": True} and torch.equal(found[0], torch.ones(3))
    assert [a.get("side_host") for a in asked] == [None, True]
    assert all(a["op"] == "run" and a["seed"] == 1 for a in asked)
    # The worker kept the trial's inputs at the first request: not a second time.
    assert [a.get("keep") for a in asked] == [None, False]

    # A caller's own ``keep`` is overridden on the second request, not passed twice.
    asked.clear()
    answers[:] = [OutputsLost("refused", device_failed=True), [torch.ones(3)]]
    outputs_beside(reference, cand, "run", 5.0, {"keep": True}, read)  # type: ignore[arg-type]
    assert [a.get("keep") for a in asked] == [True, False]

    # A loss that is the candidate's own is not asked for again.
    asked.clear()
    answers[:] = [OutputsLost("it sent no outputs")]
    _, found = outputs_beside(reference, cand, "run", 5.0, {}, read)  # type: ignore[arg-type]
    assert isinstance(found, OutputsLost) and len(asked) == 1


def test_the_second_requests_reply_keeps_what_the_first_recorded_of_the_call() -> None:
    """A candidate that made the driver refuse its outputs (a descriptor of no allocation) and
    ran differently the second time is still held to the operators its first call ran and the
    inputs it changed or aliased."""
    reference = _Worker()
    replies = [
        {"side": True, "ops": ["aten::mm", "aten::relu"], "modified_inputs": [1],
         "aliases_input": True},
        {"side": True, "ops": ["aten::relu"], "modified_inputs": [], "aliases_input": False},
    ]  # fmt: skip
    answers = [OutputsLost("refused", device_failed=True), [torch.ones(3)]]

    class _Candidate(_Worker):
        def request(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
            return replies.pop(0)

    def read(side: dict[str, Any]) -> Any:
        found = answers.pop(0)
        if isinstance(found, OutputsLost):
            raise found
        return found

    got, _ = outputs_beside(reference, _Candidate(), "run", 5.0, {}, read)  # type: ignore[arg-type]
    assert got["ops"] == ["aten::mm", "aten::relu"]
    assert got["modified_inputs"] == [1] and got["aliases_input"] is True


def test_a_malformed_record_in_either_reply_is_left_for_the_callers_checks() -> None:
    first = {"ops": ["aten::mm"], "modified_inputs": [0]}
    assert with_first_record(first, {"ops": "aten::relu"})["ops"] == "aten::relu"
    assert with_first_record(first, {"ops": [{"x": 1}]})["ops"] == [{"x": 1}]
    assert with_first_record(first, {})["ops"] == ["aten::mm"]
    assert with_first_record({"ops": 3}, {"ops": ["aten::relu"]})["ops"] == 3
