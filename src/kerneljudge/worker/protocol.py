"""The wire protocol between the supervisor and its workers.

A message is an 8-byte big-endian length followed by a ``torch.save`` payload of plain data
(dicts, lists, str, numbers, bools, None) and tensors. Payloads are read with
``torch.load(weights_only=True)``, whose unpickler admits only those types, so a message forged by
candidate code in a worker cannot execute code in the supervisor. Messages travel over a pair of
pipes dedicated to the protocol; the worker's stdout and stderr go to a capped log file, so
nothing a candidate prints can corrupt the stream.
"""

from __future__ import annotations

import io
import os
import select
import struct
import time
from typing import Any

import torch

__all__ = ["Channel", "ChannelClosed", "ChannelTimeout", "MAX_MESSAGE_BYTES", "MessageTooLarge"]

#: Largest message accepted (bytes); larger lengths mean a corrupt or hostile stream.
MAX_MESSAGE_BYTES = 32 << 30
_HEADER = struct.Struct(">Q")


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
        #: A message read in part (its buffer, bytes filled) and its payload length once known.
        self._partial: tuple[bytearray, int] | None = None
        self._length: int | None = None
        #: Longest message this end reads (bytes); at most :data:`MAX_MESSAGE_BYTES`.
        self.max_bytes = MAX_MESSAGE_BYTES

    def send(self, message: dict[str, Any]) -> None:
        """Write one message (the payload is written from the serialisation buffer itself, so
        sending costs one copy of the message's tensors).

        Raises:
            ChannelClosed: the reader is gone.
        """
        fd = self.write_fd  # once: another thread may close the channel meanwhile
        if fd < 0:
            raise ChannelClosed("the channel was closed")
        buf = io.BytesIO()
        torch.save(message, buf)
        with buf.getbuffer() as payload:
            try:
                _write_all(fd, _HEADER.pack(len(payload)))
                _write_all(fd, payload)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None

    def _fill(self, buf: bytearray, filled: int, deadline: float | None) -> int:
        """Read into ``buf`` from offset ``filled`` until it is full; returns the new offset.

        Raises:
            ChannelTimeout: the deadline passed first (the caller keeps ``buf`` and the offset
                it last got, so what was read survives).
            ChannelClosed: the writer is gone.
        """
        view = memoryview(buf)
        while filled < len(buf):
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
            self._partial = (buf, filled)
        return filled

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Read one message, waiting at most ``timeout_s`` seconds (None: forever).

        A timeout keeps the part of a message read so far; the next call goes on from there.
        The payload is read into one buffer of its exact size and the message's tensors are
        made from it, so a message costs at most twice its size while it is decoded.

        Raises:
            ChannelTimeout: nothing complete arrived in time.
            MessageTooLarge: the message is longer than ``max_bytes``.
            ChannelClosed: the writer is gone, or the stream is corrupt.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        buf, filled = self._partial or (bytearray(_HEADER.size), 0)
        if self._length is None:
            self._fill(buf, filled, deadline)
            (length,) = _HEADER.unpack(bytes(buf))
            limit = min(self.max_bytes, MAX_MESSAGE_BYTES)
            if length > limit:
                raise MessageTooLarge(length, limit)
            self._length = length
            buf, filled = bytearray(length), 0
            self._partial = (buf, filled)
        self._fill(buf, filled, deadline)
        self._partial, self._length = None, None
        try:
            # torch.load reads any seekable binary file object; its FileLike names IO[bytes] only.
            message = torch.load(
                _Reader(buf),  # type: ignore[arg-type]
                weights_only=True,
                map_location="cpu",
            )
        except Exception as exc:  # any unpickling failure means a corrupt or forged stream
            raise ChannelClosed(f"unreadable message: {type(exc).__name__}: {exc}") from None
        finally:
            del buf
        if not isinstance(message, dict):
            raise ChannelClosed("message is not a dict")
        return message

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


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[: 1 << 24]) :]


class _Reader(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (``io.BytesIO`` copies a
    ``bytearray``), for ``torch.load``."""

    def __init__(self, buf: bytearray) -> None:
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
