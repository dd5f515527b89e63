"""The wire protocol between the supervisor and its workers.

A message is an 8-byte big-endian length, the 8-byte length of its ``torch.save`` part, that
part (plain data: dicts, lists, str, numbers, bools, None, and tensors) and then the bytes of its
large tensors, each in the place of a placeholder in the ``torch.save`` part (its index, element
type and shape; :data:`RAW_MIN_BYTES`). The ``torch.save`` part is read with
``torch.load(weights_only=True)``, whose unpickler admits only those types, and the placeholders
are checked (in order, of known element types, their sizes adding up to the length announced),
so a message forged by candidate code in a worker cannot execute code in the supervisor.
Messages travel over a pair of pipes dedicated to the protocol; the worker's stdout and stderr
go to a capped log file, so nothing a candidate prints can corrupt the stream.
"""

from __future__ import annotations

import fcntl
import io
import math
import os
import select
import struct
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "MAX_MESSAGE_BYTES",
    "RAW_MIN_BYTES",
    "Channel",
    "ChannelClosed",
    "ChannelTimeout",
    "MessageTooLarge",
]

#: Largest message accepted (bytes); larger lengths mean a corrupt or hostile stream.
MAX_MESSAGE_BYTES = 32 << 30
_HEADER = struct.Struct(">Q")
#: Deepest nesting of containers a message may have, most dimensions of a raw tensor, and the
#: largest span (bytes, every dimension counted at least once) a raw tensor may have.
_MAX_DEPTH = 64
_MAX_DIMS = 64
_MAX_SPAN = 1 << 62
#: Linux's ``fcntl`` command that sets a pipe's buffer size.
_F_SETPIPE_SZ = 1031
#: Element types of newer torch versions a large tensor may have on the wire, where present.
_OPTIONAL_DTYPES = ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")


class ChannelClosed(Exception):
    """The other end closed its pipe (the process exited or died)."""


class MessageTooLarge(ChannelClosed):
    """A message longer than the reader accepts was announced (nothing of it was read).

    Attributes:
        length: its announced length (bytes).
        limit: the most the reader accepts (bytes).
    """

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"message of {length} bytes exceeds the limit of {limit}")
        self.length, self.limit = length, limit


class ChannelTimeout(Exception):
    """No complete message arrived within the timeout."""


class Channel:
    """One end of a message channel over two file descriptors.

    Args:
        read_fd: the pipe end to read messages from.
        write_fd: the pipe end to write messages to.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        #: The message being read: what has arrived of it (see :class:`_Incoming`).
        self._incoming: _Incoming | None = None
        #: Longest message this end reads (bytes); at most :data:`MAX_MESSAGE_BYTES`.
        self.max_bytes = MAX_MESSAGE_BYTES
        #: The length of the last message read whole (bytes, its header included).
        self.last_length = 0
        for fd in (read_fd, write_fd):
            _widen_pipe(fd)

    def send(self, message: dict[str, Any]) -> None:
        """Write one message. Large tensors (see :func:`_raw_tensors`) are written from their
        own memory after the rest of the message (one copy, into the pipe); the rest is a
        ``torch.save`` payload.

        Raises:
            ChannelClosed: the reader is gone.
        """
        fd = self.write_fd  # once: another thread may close the channel meanwhile
        if fd < 0:
            raise ChannelClosed("the channel was closed")
        raws: list[torch.Tensor] = []
        skeleton = _take_raw(message, raws, _shared_storages(message))
        buf = io.BytesIO()
        torch.save(skeleton, buf)
        raw_bytes = sum(t.numel() * t.element_size() for t in raws)
        with buf.getbuffer() as payload:
            try:
                length = _HEADER.size + len(payload) + raw_bytes
                _write_all(fd, _HEADER.pack(length) + _HEADER.pack(len(payload)))
                _write_all(fd, payload)
                for t in raws:
                    _write_all(fd, memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None

    def _fill(self, view: memoryview, filled: int, deadline: float | None) -> int:
        """Read into ``view`` from offset ``filled`` until it is full; returns the new offset.

        Raises:
            ChannelTimeout: the deadline passed first (what was read is kept in the message's
                state, so the next :meth:`recv` goes on from there).
            ChannelClosed: the writer is gone.
        """
        incoming = self._incoming
        while filled < len(view):
            fd = self.read_fd  # once: another thread may close the channel meanwhile
            if fd < 0:
                raise ChannelClosed("the channel was closed")
            try:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    ready = remaining > 0 and select.select([fd], [], [], remaining)[0]
                    if not ready:
                        raise ChannelTimeout()
                got = os.readv(fd, [view[filled : filled + (1 << 24)]])
            except (OSError, ValueError) as exc:  # closed under us
                raise ChannelClosed(str(exc)) from None
            if not got:
                raise ChannelClosed("end of stream")
            filled += got
            if incoming is not None:
                incoming.filled = filled
        return filled

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Read one message, waiting at most ``timeout_s`` seconds (None: forever).

        A timeout keeps the part of a message read so far; the next call goes on from there.
        The ``torch.save`` part is read into one buffer of its exact size and its tensors are
        made from it; each large tensor is read straight into its own memory, so a message
        costs at most its size plus its ``torch.save`` part while it is decoded.

        Raises:
            ChannelTimeout: nothing complete arrived in time.
            MessageTooLarge: the message is longer than ``max_bytes``.
            ChannelClosed: the writer is gone, or the stream is corrupt.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._incoming is None:
            self._incoming = _Incoming(memoryview(bytearray(_HEADER.size)))
        incoming = self._incoming
        while True:
            incoming.filled = self._fill(incoming.target, incoming.filled, deadline)
            if incoming.stage == "header":
                length = _HEADER.unpack_from(incoming.target, 0)[0]
                limit = min(self.max_bytes, MAX_MESSAGE_BYTES)
                if length > limit:
                    self._incoming = None
                    raise MessageTooLarge(length, limit)
                if length < _HEADER.size:
                    self._incoming = None
                    raise ChannelClosed("corrupt message header")
                incoming.length = length
                incoming.next("skeleton length", memoryview(bytearray(_HEADER.size)))
            elif incoming.stage == "skeleton length":
                skeleton = _HEADER.unpack_from(incoming.target, 0)[0]
                if skeleton > incoming.length - _HEADER.size:
                    self._incoming = None
                    raise ChannelClosed("corrupt message header")
                incoming.raw_bytes = incoming.length - _HEADER.size - skeleton
                incoming.next("skeleton", memoryview(bytearray(skeleton)))
            elif incoming.stage == "skeleton":
                try:
                    incoming.message = _load_skeleton(incoming.target)
                    incoming.raws = _placeholders(incoming.message, incoming.raw_bytes)
                except BaseException as exc:  # the next message starts afresh
                    self._incoming = None
                    if isinstance(exc, ChannelClosed):
                        raise
                    raise ChannelClosed(f"corrupt message: {type(exc).__name__}") from None
                incoming.next_raw()
            else:
                incoming.next_raw()
            if incoming.stage == "done":
                self._incoming = None
                self.last_length = incoming.length
                return _put_raw(incoming.message, incoming.raws)

    def close(self) -> None:
        """Close both ends; a second call does nothing (the numbers may belong to new files)."""
        fds, self.read_fd, self.write_fd = (self.read_fd, self.write_fd), -1, -1
        for fd in fds:
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass


class _Incoming:
    """What has arrived of a message being read: its stage (``header``, ``skeleton length``,
    ``skeleton``, ``raw`` or ``done``), the buffer being filled and how far, the decoded
    ``torch.save`` part and the large tensors read so far."""

    def __init__(self, target: memoryview) -> None:
        self.stage = "header"
        self.target = target
        self.filled = 0
        self.length = 0
        self.raw_bytes = 0
        self.message: Any = None
        self.raws: list[torch.Tensor] = []
        self._next_raw = 0

    def next(self, stage: str, target: memoryview) -> None:
        self.stage, self.target, self.filled = stage, target, 0

    def next_raw(self) -> None:
        """Go on with the next large tensor (or ``done`` after the last one)."""
        while self._next_raw < len(self.raws):
            t = self.raws[self._next_raw]
            self._next_raw += 1
            if t.numel():
                self.next("raw", memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
                return
        self.stage = "done"


#: Tensors of at least this many bytes travel outside the ``torch.save`` payload.
RAW_MIN_BYTES = 64 << 10
#: The key that marks a large tensor's place in the ``torch.save`` part of a message.
_RAW_KEY = "__kerneljudge_raw_tensor__"
#: Element types a large tensor may have on the wire.
_RAW_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
        torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
        torch.bool, *(getattr(torch, n) for n in _OPTIONAL_DTYPES if hasattr(torch, n)),
    )
}  # fmt: skip


def _shared_storages(message: Any) -> set[int]:
    """Addresses of the CPU storages that more than one tensor of ``message`` views."""
    seen: set[int] = set()
    shared: set[int] = set()
    tensors = {
        id(v): v
        for c in _containers(message)
        for v in (c.values() if type(c) is dict else c)
        if isinstance(v, torch.Tensor)
    }
    if isinstance(message, torch.Tensor):
        tensors[id(message)] = message
    for t in tensors.values():
        if t.device.type == "cpu" and t.layout == torch.strided:
            ptr = t.untyped_storage().data_ptr()
            (shared if ptr in seen else seen).add(ptr)
    return shared


def _raw_ok(t: torch.Tensor, shared: set[int]) -> bool:
    """Whether ``t`` travels as raw bytes: a plain, dense, contiguous CPU tensor of at least
    :data:`RAW_MIN_BYTES` that is its storage's only view (views sharing a storage go in the
    ``torch.save`` part, which keeps them shared)."""
    return bool(
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and str(t.dtype).removeprefix("torch.") in _RAW_DTYPES
        and t.numel() * t.element_size() >= RAW_MIN_BYTES
        and t.is_contiguous()
        and not (t.is_conj() or t.is_neg())
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
        and t.untyped_storage().data_ptr() not in shared
    )


def _take_raw(
    obj: Any, raws: list[torch.Tensor], shared: set[int], memo: dict[int, Any] | None = None
) -> Any:
    """``obj`` with each large tensor replaced by its placeholder (appended to ``raws``); dicts,
    lists and tuples of exactly those types are rebuilt (each once: a container met twice is
    the same rebuilt object), any other value is kept as it is."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    out: Any = obj
    if type(obj) is torch.Tensor:
        if _raw_ok(obj, shared):
            raws.append(obj)
            dtype = str(obj.dtype).removeprefix("torch.")
            out = {_RAW_KEY: len(raws) - 1, "dtype": dtype, "shape": list(obj.shape)}
    elif type(obj) is dict:
        out = {k: _take_raw(v, raws, shared, memo) for k, v in obj.items()}
    elif type(obj) is list:
        out = [_take_raw(v, raws, shared, memo) for v in obj]
    elif type(obj) is tuple:
        out = tuple(_take_raw(v, raws, shared, memo) for v in obj)
    memo[id(obj)] = out
    return out


def _load_skeleton(view: memoryview) -> Any:
    """The ``torch.save`` part of a message, loaded with ``weights_only``.

    Raises:
        ChannelClosed: it is not a zip archive of stored (uncompressed) entries no longer in all
            than itself (a compressed entry could unpack to far more than the length
            announced), it does not load, or it is not a dict.
    """
    try:
        with zipfile.ZipFile(_Reader(view)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ChannelClosed(f"unreadable message: {type(exc).__name__}: {exc}") from None
    if any(e.compress_type != zipfile.ZIP_STORED for e in entries) or sum(
        e.file_size for e in entries
    ) > len(view):
        raise ChannelClosed("corrupt message: compressed or longer than announced")
    try:
        # torch.load reads any seekable binary file object; its FileLike names IO[bytes] only.
        message = torch.load(
            _Reader(view),  # type: ignore[arg-type]
            weights_only=True,
            map_location="cpu",
        )
    except Exception as exc:  # any unpickling failure means a corrupt or forged stream
        raise ChannelClosed(f"unreadable message: {type(exc).__name__}: {exc}") from None
    if not isinstance(message, dict):
        raise ChannelClosed("message is not a dict")
    return message


def _containers(message: Any) -> Iterator[Any]:
    """Each dict, list and tuple reachable from ``message`` once (a loaded message can share
    one container in many places: visiting it as a tree could take exponential time).

    Raises:
        ChannelClosed: containers nested deeper than :data:`_MAX_DEPTH`.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(message, 0)]
    while stack:
        obj, depth = stack.pop()
        if type(obj) not in (dict, list, tuple) or id(obj) in seen:
            continue
        if depth > _MAX_DEPTH:
            raise ChannelClosed("corrupt message: nested too deep")
        seen.add(id(obj))
        yield obj
        if type(obj) is dict and _RAW_KEY in obj:
            continue  # a placeholder: its fields are checked, not searched
        values = obj.values() if type(obj) is dict else obj
        stack.extend((v, depth + 1) for v in reversed(list(values)))


def _placeholders(message: Any, raw_bytes: int) -> list[torch.Tensor]:
    """Empty tensors for the placeholders of ``message``, in their order; their sizes must add
    up to the ``raw_bytes`` announced.

    Raises:
        ChannelClosed: a placeholder is malformed, out of order or repeated, or the sizes do
            not add up (a corrupt or forged stream).
    """
    specs = [c for c in _containers(message) if type(c) is dict and _RAW_KEY in c]
    tensors: list[torch.Tensor] = []
    total = 0
    for i, spec in enumerate(specs):
        name = spec.get("dtype")
        dtype = _RAW_DTYPES.get(name) if isinstance(name, str) else None
        shape = spec.get("shape")
        if (
            set(spec) != {_RAW_KEY, "dtype", "shape"}
            or type(spec[_RAW_KEY]) is not int
            or spec[_RAW_KEY] != i
            or dtype is None
            or type(shape) is not list
            or len(shape) > _MAX_DIMS
            or not all(type(d) is int and 0 <= d <= _MAX_SPAN for d in shape)
            or math.prod(max(d, 1) for d in shape) * dtype.itemsize > _MAX_SPAN
        ):
            raise ChannelClosed("corrupt message: a malformed tensor placeholder")
        total += math.prod(shape) * dtype.itemsize
        if total > raw_bytes:
            raise ChannelClosed("corrupt message: its tensors are longer than announced")
        tensors.append(torch.empty(shape, dtype=dtype))
    if total != raw_bytes:
        raise ChannelClosed("corrupt message: its tensors are shorter than announced")
    return tensors


def _put_raw(obj: Any, raws: list[torch.Tensor], memo: dict[int, Any] | None = None) -> Any:
    """``obj`` with each placeholder replaced by its tensor (each container rebuilt once)."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    out: Any = obj
    if type(obj) is dict:
        if _RAW_KEY in obj:
            out = raws[obj[_RAW_KEY]]
        else:
            out = {k: _put_raw(v, raws, memo) for k, v in obj.items()}
    elif type(obj) is list:
        out = [_put_raw(v, raws, memo) for v in obj]
    elif type(obj) is tuple:
        out = tuple(_put_raw(v, raws, memo) for v in obj)
    memo[id(obj)] = out
    return out


def _widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (Linux ``F_SETPIPE_SZ``: fewer, larger reads and writes for a
    large message); a pipe that is not one, or a host limit, leaves it as it is."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, 1 << 20)
    except (OSError, ValueError):
        pass


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[: 1 << 24]) :]


class _Reader(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (``io.BytesIO`` copies a
    ``bytearray``), for ``torch.load``."""

    def __init__(self, buf: bytearray | memoryview) -> None:
        super().__init__()
        self._view = memoryview(buf)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n
