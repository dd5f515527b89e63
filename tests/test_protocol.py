"""The worker wire protocol: framing, partial reads across timeouts, hostile streams, memory."""

from __future__ import annotations

import os
import struct
import threading

import pytest
import torch

from kerneljudge.worker.protocol import Channel, ChannelClosed, ChannelTimeout


@pytest.fixture
def pipe_pair():
    r, w = os.pipe()
    reader, writer = Channel(r, -1), Channel(-1, w)
    yield reader, writer
    reader.close()
    writer.close()


def test_round_trip_keeps_tensors_and_plain_data(pipe_pair) -> None:
    reader, writer = pipe_pair
    msg = {
        "op": "run",
        "inputs": [torch.arange(10, dtype=torch.float16), 3, None, "x"],
        "nested": {"a": (torch.ones(2, 3, dtype=torch.bool), 1.5)},
    }
    writer.send(msg)
    got = reader.recv(timeout_s=5)
    assert got["op"] == "run"
    assert torch.equal(got["inputs"][0], msg["inputs"][0])
    assert got["inputs"][1:] == [3, None, "x"]
    assert torch.equal(got["nested"]["a"][0], msg["nested"]["a"][0])


def test_a_message_split_by_a_timeout_is_completed_by_the_next_call() -> None:
    r, w = os.pipe()
    reader = Channel(r, -1)
    payload = bytearray()
    sink_r, sink_w = os.pipe()
    Channel(-1, sink_w).send({"x": torch.arange(1000)})
    os.close(sink_w)
    while chunk := os.read(sink_r, 1 << 16):
        payload += chunk
    os.close(sink_r)
    os.write(w, bytes(payload[:5]))  # inside the header
    with pytest.raises(ChannelTimeout):
        reader.recv(timeout_s=0.05)
    os.write(w, bytes(payload[5:100]))  # inside the payload
    with pytest.raises(ChannelTimeout):
        reader.recv(timeout_s=0.05)
    os.write(w, bytes(payload[100:]))
    assert torch.equal(reader.recv(timeout_s=5)["x"], torch.arange(1000))
    os.close(w)
    reader.close()


def test_oversized_length_and_garbage_are_refused(pipe_pair) -> None:
    reader, _ = pipe_pair
    r, w = os.pipe()
    os.write(w, struct.pack(">Q", 1 << 62))
    with pytest.raises(ChannelClosed, match="exceeds the limit"):
        Channel(r, -1).recv(timeout_s=5)
    os.close(r)
    os.close(w)
    r, w = os.pipe()
    os.write(w, struct.pack(">Q", 8) + b"notatorch")
    with pytest.raises(ChannelClosed, match="unreadable message"):
        Channel(r, -1).recv(timeout_s=5)
    os.close(r)
    os.close(w)


def test_a_closed_writer_is_reported(pipe_pair) -> None:
    reader, writer = pipe_pair
    writer.close()
    with pytest.raises(ChannelClosed):
        reader.recv(timeout_s=5)


def test_a_large_message_costs_at_most_twice_its_size_to_receive() -> None:
    """The receiving process holds the payload once and the tensors made from it once."""
    size = 64 << 20
    r, w = os.pipe()
    sender = threading.Thread(
        target=lambda: Channel(-1, w).send({"t": torch.ones(size // 4)}), daemon=True
    )
    reader = Channel(r, -1)

    def hwm_bytes() -> int:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM"))

    # The sender's copy lives in this process too: 1x for the sent tensor and 1x for the
    # serialised payload while it is written; the receiving side adds at most 2x.
    tensor_and_send = 2 * size
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak
    with open("/proc/self/status") as f:
        base = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS"))
    sender.start()
    got = reader.recv(timeout_s=60)
    sender.join()
    assert got["t"].numel() == size // 4
    assert hwm_bytes() - base < tensor_and_send + 2 * size + (16 << 20)
    os.close(w)
    reader.close()
