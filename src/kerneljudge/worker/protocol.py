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

__all__ = ["Channel", "ChannelClosed", "ChannelTimeout", "MAX_MESSAGE_BYTES"]

#: Largest message accepted (bytes); larger lengths mean a corrupt or hostile stream.
MAX_MESSAGE_BYTES = 32 << 30
_HEADER = struct.Struct(">Q")


class ChannelClosed(Exception):
    """The other end closed its pipe (the process exited or died)."""


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
        self._buf = bytearray()

    def send(self, message: dict[str, Any]) -> None:
        """Write one message.

        Raises:
            ChannelClosed: the reader is gone.
        """
        fd = self.write_fd  # once: another thread may close the channel meanwhile
        if fd < 0:
            raise ChannelClosed("the channel was closed")
        buf = io.BytesIO()
        torch.save(message, buf)
        payload = buf.getvalue()
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        try:
            while data:
                written = os.write(fd, data)
                data = data[written:]
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None

    def _fill(self, n: int, deadline: float | None) -> None:
        """Read until the buffer holds ``n`` bytes; what was read survives a timeout."""
        while len(self._buf) < n:
            fd = self.read_fd  # once: another thread may close the channel meanwhile
            if fd < 0:
                raise ChannelClosed("the channel was closed")
            try:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    ready = remaining > 0 and select.select([fd], [], [], remaining)[0]
                    if not ready:
                        raise ChannelTimeout()
                chunk = os.read(fd, min(n - len(self._buf), 1 << 24))
            except (OSError, ValueError) as exc:  # closed under us
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                raise ChannelClosed("end of stream")
            self._buf += chunk

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Read one message, waiting at most ``timeout_s`` seconds (None: forever).

        A timeout keeps the part of a message read so far; the next call goes on from there.

        Raises:
            ChannelTimeout: nothing complete arrived in time.
            ChannelClosed: the writer is gone, or the stream is corrupt.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._fill(_HEADER.size, deadline)
        (length,) = _HEADER.unpack(bytes(self._buf[: _HEADER.size]))
        if length > MAX_MESSAGE_BYTES:
            raise ChannelClosed(f"message of {length} bytes exceeds the limit")
        self._fill(_HEADER.size + length, deadline)
        payload = bytes(self._buf[_HEADER.size : _HEADER.size + length])
        del self._buf[: _HEADER.size + length]
        try:
            message = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as exc:  # any unpickling failure means a corrupt or forged stream
            raise ChannelClosed(f"unreadable message: {type(exc).__name__}: {exc}") from None
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
