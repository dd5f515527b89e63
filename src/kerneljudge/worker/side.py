"""A candidate's outputs sent straight to the reference worker, on a pipe of their own.

A correctness trial's outputs and an audited timed call's are compared in the reference
worker. Relayed through the supervisor they cross two pipes and are copied in and out of the
supervisor's memory; for outputs of gigabytes that is most of a verdict. Here the supervisor
makes one pipe per transfer (:class:`SidePipe`), hands its read end to the reference worker and
its write end to the candidate's worker (over each worker's hand-over socket, ``SCM_RIGHTS``),
then asks both at once: the candidate's worker writes the outputs there as one channel message
(:func:`send_outputs`), the reference worker reads and compares them (:func:`recv_outputs`).

The reference worker reads the message with the same checks the supervisor's channel applies
(:class:`kerneljudge.worker.protocol.Channel`: ``torch.load(weights_only=True)`` of the plain
part, placeholders checked, a length limit), so nothing the candidate writes there can do more
than the same bytes sent to the supervisor. The supervisor keeps a write end of its own (not
blocking): once the candidate's worker answered, or failed, it writes a short closing message
there where the pipe has room (:meth:`SidePipe.finish`), so that a reference worker still
waiting for a message (nothing was written) gets an answer at once instead of waiting out its
limit; it then closes it, so that one cut short ends when the candidate's worker's end closes.

Between two GPU workers, outputs of a megabyte or more need not cross the host at all: beside
the pipe each worker gets one end of a socket pair, the candidate's worker copies those outputs
into device memory it exports (:mod:`kerneljudge.worker.vmm`), sends its descriptor on the
socket and a placeholder for each in the message, and the reference worker copies them out
device to device, its close of the socket telling the writer it may free them. Where the
driver cannot export, the outputs go through the host as before; where the reference worker's
driver will not import them, its answer says so and the supervisor asks again through the host
(:func:`kerneljudge.check.beside.outputs_beside`).

Imports only the standard library, torch, :mod:`kerneljudge.worker.protocol` and
:mod:`kerneljudge.worker.vmm`.
"""

from __future__ import annotations

import array
import functools
import os
import secrets
import select
import socket
from collections.abc import Callable
from typing import Any

from kerneljudge.worker.protocol import Channel, ChannelClosed, ChannelTimeout, MessageTooLarge
from kerneljudge.worker.vmm import HandoffError, device_message, from_device

__all__ = [
    "COPY_WAIT_S",
    "HandOverFailed",
    "SidePipe",
    "hand_over",
    "link_label",
    "outputs_reply",
    "recv_outputs",
    "send_outputs",
    "take_handed",
]

#: The key of the message the supervisor writes once the candidate's worker answered.
_CLOSING = "__kerneljudge_side_closed__"
#: The longest a writer waits for the reader to copy its outputs off the device (seconds);
#: past it the memory is released and a reader that had not mapped it yet fails to.
COPY_WAIT_S = 60.0


def hand_over(sock: socket.socket, fd: int, token: bytes) -> None:
    """Send ``fd`` over the hand-over socket ``sock``, labelled ``token`` (the datagram's
    bytes; the request that uses it names the same token).

    Raises:
        OSError: the other end is gone.
    """
    sock.sendmsg([token], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def take_handed(sock: socket.socket | None, token: bytes) -> int:
    """The descriptor handed over on ``sock`` labelled ``token`` (it was sent before the
    request that names it, so it is there); descriptors handed over before it and never taken
    (their request failed first) are closed on the way.

    Raises:
        RuntimeError: no socket, or no descriptor with that label.
    """
    if sock is None:
        raise RuntimeError("this worker has no hand-over socket")
    while True:
        fds = array.array("i")
        try:
            label, ancillary, _, _ = sock.recvmsg(
                len(token) + 1,
                socket.CMSG_SPACE(4 * fds.itemsize),
                socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC,
            )
        except BlockingIOError:
            raise RuntimeError("no pipe was handed over for the outputs") from None
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        keep = fds[0] if label == token and fds else -1
        for fd in fds:
            if fd != keep:
                os.close(fd)
        if keep >= 0:
            return keep


def send_outputs(
    sock: socket.socket | None,
    token: bytes,
    outputs: Any,
    to_host: Callable[[Any], Any] | None = None,
    on_device: bool = True,
    device: Any = None,
) -> None:
    """Write ``{"outputs": outputs}`` as one message to the pipe handed over on ``sock`` as
    ``token``, then close it. With ``to_host`` (what makes a value fit to send: a host copy of
    a tensor, a Fault for a value that is none), each CUDA tensor of at least
    :data:`kerneljudge.worker.vmm.DEVICE_MIN_BYTES` stays on the device where ``on_device``
    and the socket handed over beside the pipe (:func:`link_label`) allow it
    (:func:`kerneljudge.worker.vmm.device_message`; with a CUDA ``device``, host tensors of
    that size are copied onto it and sent the same way), the rest goes through ``to_host``; this
    then returns once the reader copied them or let go (at most :data:`COPY_WAIT_S` seconds
    later), and the device memory is released.

    Raises:
        RuntimeError: no pipe was handed over.
        ChannelClosed: the reader is gone.
        whatever ``to_host`` raises.
    """
    fd = take_handed(sock, token)
    link = _take_link(sock, token)
    export = None
    try:
        message: dict[str, Any] | None = None
        if to_host is not None and on_device and link is not None:
            message, export = device_message(outputs, to_host, device)
        if export is not None and link is not None:
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [export.fd]))
            try:
                link.sendmsg([b"m"], [rights])
            except OSError:
                message = None
        if message is None:
            message = {"outputs": to_host(outputs) if to_host is not None else outputs}
        Channel(-1, fd).send(message)
        if link is not None and "device_bytes" in message:
            link.settimeout(COPY_WAIT_S)
            try:
                link.recv(1)  # the reader closes its end once it copied them (or gave up)
            except OSError:
                pass
    finally:
        os.close(fd)
        if link is not None:
            link.close()
        if export is not None:
            export.close()


def recv_outputs(
    sock: socket.socket | None,
    token: bytes,
    timeout_s: float,
    max_bytes: int,
    device: Any = None,
) -> tuple[Any, str, bool]:
    """Read the outputs a candidate's worker wrote to the pipe handed over on ``sock`` as
    ``token``, within ``timeout_s`` seconds and ``max_bytes`` bytes (those sent on the device
    counted), the ones sent on the device copied onto ``device`` (this worker's CUDA device;
    :func:`kerneljudge.worker.vmm.from_device`): ``(outputs, "", False)``, or
    ``(None, why, failed)`` when none came (the pipe closed, the supervisor's closing message
    came first, the message was corrupt, too long or late); ``failed`` is True when they were
    sent on the device, well formed, on a descriptor of no regular file, pipe, socket or
    directory, and the driver would not import, map or copy them: worth asking again through
    the host (a sender can cause this too, with a descriptor of no allocation of that size: the
    caller keeps what the first request recorded).

    Raises:
        RuntimeError: no pipe was handed over (a harness error).
    """
    fd = take_handed(sock, token)
    link = _take_link(sock, token)
    chan = Channel(fd, -1)
    chan.max_bytes = max_bytes
    try:
        try:
            message = chan.recv(timeout_s=timeout_s)
        except MessageTooLarge as exc:
            return None, _too_large(exc.length, exc.limit), False
        except ChannelTimeout:
            return None, f"its outputs did not arrive within {timeout_s:.0f} s", False
        except ChannelClosed as exc:
            return None, f"its outputs did not arrive whole ({exc})", False
        finally:
            chan.close()
        if _CLOSING in message or "outputs" not in message:
            return None, "it sent no outputs", False
        if "device_bytes" not in message:
            return message["outputs"], "", False
        try:
            host_bytes = chan.last_length
            return from_device(message, link, max_bytes, device, host_bytes), "", False
        except HandoffError as exc:
            return None, f"its outputs could not be taken from the device: {exc}", True
        except MessageTooLarge as exc:
            return None, _too_large(exc.length, exc.limit), False
        except ValueError as exc:
            return None, str(exc), False
    finally:
        if link is not None:
            link.close()  # the writer's wait ends: its device memory may go


def _too_large(length: int, limit: int) -> str:
    mib = float(1 << 20)
    return f"its outputs of {length / mib:.0f} MiB exceed the {limit / mib:.0f} MiB the judge reads"


def link_label(token: bytes) -> bytes:
    """The label of the socket handed over beside the pipe labelled ``token``: the descriptor
    of the outputs' device memory crosses it, and the reader's close of it tells the writer
    that they were copied."""
    return token + b"+"


def _take_link(sock: socket.socket | None, token: bytes) -> socket.socket | None:
    """The socket handed over beside the pipe ``token`` labels, or None where none was."""
    try:
        return socket.socket(fileno=take_handed(sock, link_label(token)))
    except (RuntimeError, OSError):
        return None


@functools.cache
def _closing_message() -> bytes:
    """The closing message's bytes, as a channel writes them (at most ``PIPE_BUF``)."""
    read_end, write_end = os.pipe()
    try:
        Channel(-1, write_end).send({_CLOSING: True})
        data = os.read(read_end, select.PIPE_BUF + 1)
    finally:
        os.close(read_end)
        os.close(write_end)
    if len(data) > select.PIPE_BUF:
        raise RuntimeError("the closing message is longer than PIPE_BUF")
    return data


class HandOverFailed(OSError):
    """A pipe's end could not be handed to a worker (``role``: ``"candidate"`` or
    ``"reference"``): it is gone, or the host refused the descriptor (``ETOOMANYREFS``: its
    user has too many descriptors in flight)."""

    def __init__(self, role: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"the {role} worker's end could not be handed over: {cause}")
        self.role = role


class SidePipe:
    """One transfer's pipe, supervisor side: ``reader`` gets the read end, ``writer`` the
    write end (each a :class:`kerneljudge.worker.process.WorkerProcess`, through its
    ``hand_over``), both labelled :attr:`token` (name it in the requests as ``side``: its hex);
    the supervisor keeps a non-blocking write end of its own until :meth:`finish`. Use as a
    context manager: leaving it finishes it.

    Raises:
        OSError: no pipe could be made; HandOverFailed: an end could not be handed over (the
            candidate's is handed first).
    """

    def __init__(self, reader: Any, writer: Any) -> None:
        self.token = secrets.token_bytes(8)
        read_end, write_end = os.pipe()
        try:
            # A write end of its own, not blocking (a flag of the open file, which the
            # candidate's end does not share): the closing message never waits.
            self._write_end: int | None = os.open(
                f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
            )
            try:
                writer.hand_over(write_end, self.token)
            except OSError as exc:
                raise HandOverFailed("candidate", exc) from None
            try:
                reader.hand_over(read_end, self.token)
            except OSError as exc:
                raise HandOverFailed("reference", exc) from None
            # Beside it, a socket between the two workers only: the outputs' device memory
            # crosses it, and the reader's close of it ends the writer's wait.
            ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                pairs = (("candidate", writer, ends[0]), ("reference", reader, ends[1]))
                for role, worker, end in pairs:
                    try:
                        worker.hand_over(end.fileno(), link_label(self.token))
                    except OSError as exc:
                        raise HandOverFailed(role, exc) from None
            finally:
                for end in ends:
                    end.close()
        except BaseException:
            self.finish()
            raise
        finally:
            os.close(read_end)
            os.close(write_end)

    def finish(self) -> None:
        """Write the closing message where the pipe has room for it (it is shorter than
        ``PIPE_BUF``, so that a write to the non-blocking end is whole or refused) and close
        the supervisor's write end; a second call does nothing."""
        fd, self._write_end = getattr(self, "_write_end", None), None
        if fd is None:
            return
        try:
            os.write(fd, _closing_message())
        except OSError:  # full, or no reader left
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> SidePipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def outputs_reply(
    sock: socket.socket | None,
    msg: dict[str, Any],
    outputs: Any,
    to_host: Callable[[Any], Any],
    device: Any = None,
) -> dict[str, Any]:
    """The part of a candidate worker's reply that carries ``outputs``: ``{"outputs":
    to_host(outputs)}``, or, when the request names a pipe (``side``: a token's hex),
    ``{"side": True}`` once they were written there (:func:`send_outputs` with ``device``, on
    the device unless the request says ``side_host``; a reader that stopped reading, say at a
    message longer than it reads, answers the supervisor why itself).

    Raises:
        RuntimeError: no pipe was handed over.
        whatever ``to_host`` raises.
    """
    if not msg.get("side"):
        return {"outputs": to_host(outputs)}
    try:
        on_device = not msg.get("side_host")
        token = bytes.fromhex(str(msg["side"]))
        send_outputs(sock, token, outputs, to_host, on_device, device)
    except ChannelClosed:
        pass
    return {"side": True}
