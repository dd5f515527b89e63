"""The worker wire protocol: framing, partial reads across timeouts, hostile streams, memory."""

from __future__ import annotations

import os
import struct
import threading

import pytest
import torch

from kerneljudge.worker.protocol import RAW_MIN_BYTES, Channel, ChannelClosed, ChannelTimeout


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
    os.write(w, struct.pack(">Q", 17) + struct.pack(">Q", 9) + b"notatorch")
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


def _wire(message: dict) -> bytes:
    """The bytes :meth:`Channel.send` writes for ``message``."""
    r, w = os.pipe()
    out = bytearray()
    sender = threading.Thread(target=lambda: (Channel(-1, w).send(message), os.close(w)))
    sender.start()
    while chunk := os.read(r, 1 << 20):
        out += chunk
    sender.join()
    os.close(r)
    return bytes(out)


def test_large_tensors_travel_raw_and_keep_values_types_and_sharing(pipe_pair) -> None:
    reader, writer = pipe_pair
    n = RAW_MIN_BYTES  # elements: every tensor below is at least RAW_MIN_BYTES long
    base = torch.randn(2 * n)
    msg = {
        "f32": torch.randn(n, 3),
        "bf16": torch.randn(n).to(torch.bfloat16),
        "bool": torch.rand(n) > 0.5,
        "i64": torch.arange(n),
        "strided": torch.randn(n, 4).t(),  # not contiguous: in the torch.save part
        "views": (base[:n], base[n:]),  # one storage: in the torch.save part, still shared
        "empty": torch.empty(0, 5),
        "small": torch.ones(3),
        "plain": [1, "x", None],
    }
    # The bytes of the four large contiguous tensors are in the message once, outside the
    # torch.save part: the message is barely longer than the tensors themselves.
    wire = _wire(msg)
    raw = sum(msg[k].numel() * msg[k].element_size() for k in ("f32", "bf16", "bool", "i64"))
    skeleton = struct.unpack(">Q", wire[8:16])[0]
    assert len(wire) == 16 + skeleton + raw
    sender = threading.Thread(target=writer.send, args=(msg,), daemon=True)
    sender.start()  # a pipe holds 1 MiB: the message is written while it is read
    got = reader.recv(timeout_s=30)
    sender.join()
    for key in ("f32", "bf16", "bool", "i64", "strided", "empty", "small"):
        assert got[key].dtype == msg[key].dtype and torch.equal(got[key], msg[key]), key
    a, b = got["views"]
    assert torch.equal(a, base[:n]) and torch.equal(b, base[n:])
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert got["plain"] == [1, "x", None]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def test_a_message_split_inside_a_raw_tensor_is_completed_by_the_next_call() -> None:
    x = torch.randn(RAW_MIN_BYTES)
    wire = _wire({"x": x, "y": torch.arange(RAW_MIN_BYTES)})
    r, w = os.pipe()
    reader = Channel(r, -1)
    cuts = [3, 12, 40, len(wire) - 3 * RAW_MIN_BYTES, len(wire) - 5, len(wire)]
    done = 0
    got = None
    for end in cuts:
        writer = threading.Thread(target=_write_all, args=(w, wire[done:end]))
        writer.start()
        tries = 0
        while writer.is_alive() or (got is None and end == len(wire) and tries < 50):
            tries += 1
            try:
                got = reader.recv(timeout_s=0.2)
            except ChannelTimeout:  # the rest has not arrived (or arrived as the time ran out)
                pass
        writer.join()
        assert (got is None) == (end < len(wire))
        done = end
    assert got is not None
    assert torch.equal(got["x"], x) and torch.equal(got["y"], torch.arange(RAW_MIN_BYTES))
    os.close(w)
    reader.close()


@pytest.mark.parametrize(
    "placeholder, raw, why",
    [
        ({"__kerneljudge_raw_tensor__": 1, "dtype": "float32", "shape": [4]}, 16, "malformed"),
        ({"__kerneljudge_raw_tensor__": 0, "dtype": "object", "shape": [4]}, 16, "malformed"),
        ({"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [-1]}, 16, "malformed"),
        ({"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [4], "x": 1}, 16,
         "malformed"),
        ({"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [1 << 40]}, 16,
         "longer than announced"),
        ({"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [2]}, 16,
         "shorter than announced"),
    ],
)  # fmt: skip
def test_forged_tensor_placeholders_are_refused(placeholder, raw, why) -> None:
    import io

    buf = io.BytesIO()
    torch.save({"t": placeholder}, buf)
    skeleton = buf.getvalue()
    r, w = os.pipe()
    body = struct.pack(">Q", len(skeleton)) + skeleton + bytes(raw)
    writer = threading.Thread(
        target=os.write, args=(w, struct.pack(">Q", len(body)) + body), daemon=True
    )
    writer.start()
    with pytest.raises(ChannelClosed, match=why):
        Channel(r, -1).recv(timeout_s=5)
    os.close(r)
    os.close(w)


def _forged(skeleton_obj: object, raw: bytes = b"", compress: bool = False) -> bytes:
    """The bytes of a message whose torch.save part is ``skeleton_obj`` (re-packed with deflated
    entries when ``compress``) followed by ``raw``."""
    import io
    import zipfile

    buf = io.BytesIO()
    torch.save(skeleton_obj, buf)
    skeleton = buf.getvalue()
    if compress:
        packed = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(skeleton)) as src, zipfile.ZipFile(packed, "w") as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
        skeleton = packed.getvalue()
    body = struct.pack(">Q", len(skeleton)) + skeleton + raw
    return struct.pack(">Q", len(body)) + body


def _read_after(wire: bytes, then: dict) -> tuple[Exception | None, dict | None]:
    """Feed ``wire`` and then an honest message ``then`` to one reader: what the first read
    raised, and what the second one returned when the first read the whole of ``wire`` (a
    refused message leaves the stream where the refusal stopped: the supervisor ends such a
    worker)."""
    r, w = os.pipe()
    reader = Channel(r, -1)
    writer = threading.Thread(target=lambda: (_write_all(w, wire), Channel(-1, w).send(then)))
    writer.start()
    raised = None
    try:
        reader.recv(timeout_s=10)
    except Exception as exc:  # noqa: BLE001 - what it raised is the result
        raised = exc
    got = reader.recv(timeout_s=10) if raised is None else None
    writer.join()  # ``then`` is small: it fits in the pipe, read or not
    os.close(w)
    reader.close()
    return raised, got


@pytest.mark.parametrize(
    "placeholder",
    [
        {"__kerneljudge_raw_tensor__": torch.tensor([0, 1]), "dtype": "float32", "shape": [1]},
        {"__kerneljudge_raw_tensor__": True, "dtype": "float32", "shape": [1]},
        {"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [0, 2**70]},
        {"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [0, 2**40, 2**40]},
        {"__kerneljudge_raw_tensor__": 0, "dtype": "float32", "shape": [True]},
    ],
)
def test_a_forged_placeholder_is_refused_as_a_closed_channel(placeholder) -> None:
    """Refused as ``ChannelClosed`` (the supervisor's one sign of a broken worker), never
    another exception from deep inside, and not again at the next read."""
    wire = _forged({"t": placeholder}, bytes(4))
    r, w = os.pipe()
    reader = Channel(r, -1)
    _write_all(w, wire)
    with pytest.raises(ChannelClosed):
        reader.recv(timeout_s=10)
    with pytest.raises(ChannelTimeout):  # a fresh read starts a new message, no second raise
        reader.recv(timeout_s=0.1)
    os.close(w)
    reader.close()


def test_a_message_that_shares_its_containers_is_read_in_linear_time() -> None:
    """A pickle can name one list in many places: 60 levels of ``[a, a]`` are 2^60 paths."""
    import time

    shared: list = [torch.zeros(2)]
    for _ in range(60):
        shared = [shared, shared]
    started = time.monotonic()
    raised, got = _read_after(_forged({"x": shared}), {"op": "next"})
    assert raised is None and got == {"op": "next"}
    assert time.monotonic() - started < 60


def test_a_compressed_torch_save_part_is_refused() -> None:
    """A deflated entry could unpack to far more than the length the reader agreed to."""
    raised, _ = _read_after(_forged({"t": torch.zeros(1 << 16)}, compress=True), {"op": "n"})
    assert isinstance(raised, ChannelClosed) and "compressed" in str(raised)


def test_shared_containers_stay_shared_and_subclasses_keep_their_type(pipe_pair) -> None:
    from collections import OrderedDict

    reader, writer = pipe_pair
    big = torch.arange(RAW_MIN_BYTES)
    inner = [big, 1]
    msg = {"a": inner, "b": inner, "size": torch.Size([2, 3]), "od": OrderedDict(k=1)}
    sender = threading.Thread(target=writer.send, args=(msg,), daemon=True)
    sender.start()
    got = reader.recv(timeout_s=30)
    sender.join()
    assert got["a"] is got["b"] and torch.equal(got["a"][0], big)
    assert type(got["size"]) is torch.Size and type(got["od"]) is OrderedDict
