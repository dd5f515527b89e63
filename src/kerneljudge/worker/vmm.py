"""Device memory handed from one worker to another on the same GPU, without the host.

A candidate's outputs of gigabytes cost seconds when they go device to host, through a pipe and
host to device again in the reference worker. Here the candidate's worker copies them into one
allocation made with the CUDA driver's virtual memory management (``cuMemCreate``, asking for a
POSIX file descriptor as its shareable handle), exports that descriptor
(``cuMemExportToShareableHandle``) and sends it over a socket with ``SCM_RIGHTS``
(:mod:`kerneljudge.worker.side`); the reference worker imports it
(``cuMemImportFromShareableHandle``), maps it into its own address space and copies each output
out into memory of its own, device to device, before anything reads them. A descriptor crosses
PID namespaces, as the workers' sandboxes need; CUDA's older IPC handles do not.

Nothing here trusts the exporter: the importer refuses a descriptor of a regular file, pipe,
socket or directory before the driver sees it (an exported allocation's is a character device),
maps only the bytes the message announced, read-only (the driver refuses a mapping longer than
the allocation, and a descriptor that is no exported allocation), copies them once, and drops
the mapping; what the candidate could do to those bytes meanwhile it could do to the bytes it
writes to a pipe.

The driver is reached through ``ctypes`` (``libcuda.so.1``); every call is checked and a failure
raises :class:`HandoffError` naming the call and the driver's error name. Imports only the
standard library, torch and :mod:`kerneljudge.worker.protocol`; the messages that carry the
placeholders of such outputs are made and read here too (:func:`device_message`,
:func:`from_device`).
"""

from __future__ import annotations

import array
import ctypes
import functools
import math
import os
import socket
import stat
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kerneljudge.worker.protocol import _RAW_DTYPES, MessageTooLarge

__all__ = [
    "ALIGN",
    "DEVICE_MIN_BYTES",
    "Export",
    "HandoffError",
    "device_message",
    "from_device",
    "import_tensors",
    "span",
]

#: Each tensor starts at a multiple of this many bytes in an exported allocation.
ALIGN = 512
#: CUDA outputs of at least this many bytes stay on the device (smaller ones cost less through
#: the host than an allocation of the driver's granularity, 2 MiB on the H200).
DEVICE_MIN_BYTES = 1 << 20
#: The key that marks an output sent on the device in a message's ``outputs``.
_DEVICE_KEY = "__kerneljudge_device_tensor__"
# CUDA driver enums (cuda.h): CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_HANDLE_TYPE_POSIX_FILE_
# DESCRIPTOR, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
# CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ACCESS_FLAGS_PROT_READ.
_PINNED, _POSIX_FD, _ON_DEVICE, _READ_WRITE, _MINIMUM, _READ = 1, 1, 1, 3, 0, 1


class HandoffError(RuntimeError):
    """A driver call of the handoff failed, or the driver cannot be loaded."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    """``CUmemAllocationProp``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    """``CUmemAccessDesc``."""

    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_U64, _SIZE, _PTR = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
_SIGNATURES: dict[str, list[Any]] = {
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuCtxGetDevice": [ctypes.POINTER(ctypes.c_int)],
    "cuMemGetAllocationGranularity": [
        ctypes.POINTER(_SIZE), ctypes.POINTER(_AllocationProp), ctypes.c_int,
    ],
    "cuMemCreate": [ctypes.POINTER(_U64), _SIZE, ctypes.POINTER(_AllocationProp), _U64],
    "cuMemAddressReserve": [ctypes.POINTER(_U64), _SIZE, _SIZE, _U64, _U64],
    "cuMemMap": [_U64, _SIZE, _SIZE, _U64, _U64],
    "cuMemSetAccess": [_U64, _SIZE, ctypes.POINTER(_AccessDesc), _SIZE],
    "cuMemUnmap": [_U64, _SIZE],
    "cuMemAddressFree": [_U64, _SIZE],
    "cuMemRelease": [_U64],
    "cuMemExportToShareableHandle": [_PTR, _U64, ctypes.c_int, _U64],
    "cuMemImportFromShareableHandle": [ctypes.POINTER(_U64), _PTR, ctypes.c_int],
    "cuMemcpyDtoDAsync_v2": [_U64, _U64, _SIZE, _PTR],
    "cuMemcpyHtoDAsync_v2": [_U64, _PTR, _SIZE, _PTR],
    "cuMemcpyDtoH_v2": [_PTR, _U64, _SIZE],
}  # fmt: skip


@functools.cache
def _driver() -> Any:
    """``libcuda.so.1`` with the signatures of the calls used here.

    Raises:
        HandoffError: no driver library, or one without these calls.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
    except (OSError, AttributeError) as exc:
        raise HandoffError(f"the CUDA driver cannot be used: {exc}") from None
    return lib


def _call(name: str, *args: Any) -> None:
    """Call the driver's ``name``; raise HandoffError unless it returned ``CUDA_SUCCESS``."""
    lib = _driver()
    code = getattr(lib, name)(*args)
    if code:
        label = ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(label))
        raise HandoffError(f"{name} failed: {(label.value or b'error %d' % code).decode()}")


def _ordinal(device: torch.device) -> int:
    """The driver's ordinal of ``device``, with its primary context made current on this
    thread (``torch.cuda.set_device``, then a synchronisation: the runtime binds the context
    to a thread at its first call there); the device's queued work is done when it returns.

    Raises:
        HandoffError: no such CUDA device.
    """
    try:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        torch.cuda.synchronize(device)  # a runtime call: the context is current on this thread
    except (RuntimeError, AssertionError, ValueError) as exc:  # no such device, no CUDA
        raise HandoffError(f"no CUDA device {device}: {exc}") from None
    ordinal = ctypes.c_int(-1)
    _call("cuCtxGetDevice", ctypes.byref(ordinal))
    return ordinal.value


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.requestedHandleTypes = _PINNED, _POSIX_FD
    prop.location.type, prop.location.id = _ON_DEVICE, ordinal
    return prop


def _granularity(ordinal: int) -> int:
    size = _SIZE(0)
    prop = _prop(ordinal)
    _call("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(prop), _MINIMUM)
    return max(1, size.value)


def span(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """``(offsets, total)``: each of tensors of ``nbytes`` bytes placed one after the other,
    each at a multiple of :data:`ALIGN`; ``total`` the bytes they reach."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


class _Mapping:
    """``size`` bytes of the allocation ``handle`` mapped at :attr:`ptr` for ``ordinal``'s
    reads and writes (reads only with ``read_only``); :meth:`close` unmaps, frees the range
    and releases the handle (each once, whatever failed before)."""

    def __init__(self, handle: int, size: int, ordinal: int, read_only: bool = False) -> None:
        self.handle, self.size, self.ptr = handle, size, 0
        try:
            ptr = _U64(0)
            _call("cuMemAddressReserve", ctypes.byref(ptr), size, 0, 0, 0)
            self.ptr = ptr.value
            self._mapped = False
            _call("cuMemMap", self.ptr, size, 0, handle, 0)
            self._mapped = True
            access = _AccessDesc()
            access.location.type, access.location.id = _ON_DEVICE, ordinal
            access.flags = _READ if read_only else _READ_WRITE
            _call("cuMemSetAccess", self.ptr, size, ctypes.byref(access), 1)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        ptr, self.ptr = self.ptr, 0
        handle, self.handle = self.handle, 0
        try:
            try:
                if ptr and getattr(self, "_mapped", False):
                    _call("cuMemUnmap", ptr, self.size)
            finally:
                if ptr:
                    _call("cuMemAddressFree", ptr, self.size)
        finally:
            if handle:
                _call("cuMemRelease", handle)


class Export:
    """Copies of ``tensors`` (plain, dense; on ``device``, None: the first one's, or on the
    host) in one allocation on that device that another process may import: :attr:`fd` is its
    descriptor, :attr:`offsets` where each tensor's bytes start, :attr:`size` the bytes to map
    (a multiple of the driver's granularity). :meth:`close` releases it (the importer's
    mapping, if any, keeps the memory until it is dropped too).

    Raises:
        HandoffError: a driver call failed (no VMM, no descriptor handles, out of memory).
    """

    def __init__(self, tensors: Sequence[torch.Tensor], device: torch.device | None = None) -> None:
        device = tensors[0].device if device is None else device
        ordinal = _ordinal(device)
        self.offsets, end = span([t.numel() * t.element_size() for t in tensors])
        grain = _granularity(ordinal)
        self.size = max(grain, -(-end // grain) * grain)
        self.fd = -1
        handle = _U64(0)
        _call("cuMemCreate", ctypes.byref(handle), self.size, ctypes.byref(_prop(ordinal)), 0)
        self._mapping = _Mapping(handle.value, self.size, ordinal)
        try:
            stream = torch.cuda.current_stream(device)
            sources = [t.detach().contiguous() for t in tensors]  # held until synchronised
            for src, offset in zip(sources, self.offsets):
                _call(
                    "cuMemcpyDtoDAsync_v2" if src.is_cuda else "cuMemcpyHtoDAsync_v2",
                    self._mapping.ptr + offset,
                    src.data_ptr() if src.is_cuda else _PTR(src.data_ptr()),
                    src.numel() * src.element_size(),
                    _PTR(stream.cuda_stream),
                )
            stream.synchronize()
            fd = ctypes.c_int(-1)
            handle_of = self._mapping.handle
            _call("cuMemExportToShareableHandle", ctypes.byref(fd), handle_of, _POSIX_FD, 0)
            self.fd = fd.value
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the allocation and close the descriptor; a second call does nothing."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
        self._mapping.close()


def import_tensors(
    fd: int, size: int, specs: Sequence[tuple[torch.dtype, list[int], int]], device: torch.device
) -> list[torch.Tensor]:
    """Tensors of ``specs`` (``(dtype, shape, offset)`` each, validated by the caller to lie
    within ``size`` bytes) copied out of the allocation exported as ``fd``, mapped read-only,
    into memory of this process on ``device``; where the device has no room for them, into
    host memory. The mapping is dropped, after the copies are done, before this returns;
    ``fd`` is the caller's to close.

    Raises:
        ValueError: ``fd`` is a regular file, pipe, socket or directory, or ``size`` is no
            whole number of the driver's allocation grains: the sender's doing.
        HandoffError: the driver refused the descriptor (no exported allocation of at least
            ``size`` bytes on this device), or a copy or an allocation for it failed.
    """
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        raise ValueError(f"its device memory came as no open descriptor ({exc})") from None
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISDIR(mode):
        raise ValueError("its device memory came as a descriptor of no device (a file or pipe)")
    ordinal = _ordinal(device)
    if size <= 0 or size % _granularity(ordinal):
        raise ValueError(f"{size} bytes of device memory is no whole number of allocation grains")
    handle = _U64(0)
    _call("cuMemImportFromShareableHandle", ctypes.byref(handle), _PTR(fd), _POSIX_FD)
    mapping = _Mapping(handle.value, size, ordinal, read_only=True)
    stream = None
    try:
        stream = torch.cuda.current_stream(device)
        out: list[torch.Tensor] = []
        for dtype, shape, offset in specs:
            nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
            try:
                t = torch.empty(shape, dtype=dtype, device=device)
            except torch.cuda.OutOfMemoryError:
                t = torch.empty(shape, dtype=dtype)
            if not nbytes:
                pass
            elif t.is_cuda:
                on = _PTR(stream.cuda_stream)
                _call("cuMemcpyDtoDAsync_v2", t.data_ptr(), mapping.ptr + offset, nbytes, on)
            else:
                stream.synchronize()
                _call("cuMemcpyDtoH_v2", _PTR(t.data_ptr()), mapping.ptr + offset, nbytes)
            out.append(t)
        stream.synchronize()
        return out
    except HandoffError:
        raise
    except RuntimeError as exc:  # no host memory for a copy, a CUDA error while copying
        raise HandoffError(f"its device memory could not be copied: {exc}") from None
    finally:
        try:
            if stream is not None:
                stream.synchronize()  # no copy still reads the mapping when it goes
        except RuntimeError:
            pass
        mapping.close()


def device_message(
    outputs: Any, to_host: Callable[[Any], Any], device: torch.device | None = None
) -> tuple[dict[str, Any] | None, Export | None]:
    """``(message, export)``: ``outputs`` (tensors, None and numbers in nested lists and
    tuples) with each plain, dense CUDA tensor of at least :data:`DEVICE_MIN_BYTES` bytes (on
    ``device``, else on the first one's) replaced by a placeholder (its ``dtype``, ``shape``,
    ``offset`` in the export) and copied into one exported allocation (:class:`Export`), every
    other value through ``to_host``; the message names the allocation's ``device_bytes``.
    With a CUDA ``device`` (this worker's; no index: the current one), host tensors of that
    size qualify too (outputs kept on the host for want of device room) and the allocation is
    on it. ``(None, None)`` when no tensor qualifies or the driver could not export them (the
    caller then sends them through the host). Raises whatever ``to_host`` raises."""
    picked: list[torch.Tensor] = []
    device = device if device is not None and device.type == "cuda" else None
    if device is not None and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    skeleton = _placeholders(outputs, picked, device, to_host)
    if not picked:
        return None, None
    try:
        export = Export(picked, device or picked[0].device)
    except (HandoffError, RuntimeError):  # no VMM here, or no room on the device for it
        return None, None
    for spec in _device_specs(skeleton):
        spec["offset"] = export.offsets[spec[_DEVICE_KEY]]
    return {"outputs": skeleton, "device_bytes": export.size}, export


def _placeholders(value: Any, picked: list[torch.Tensor], device: Any, to_host: Any) -> Any:
    """``value`` as :func:`device_message` sends it, each tensor it picks appended to
    ``picked`` (a module function: a closure that calls itself is a reference cycle, and would
    keep ``picked``, device memory, until the cyclic collector ran)."""
    if (
        type(value) is torch.Tensor
        and (value.is_cuda or (device is not None and value.device.type == "cpu"))
        and value.layout == torch.strided
        and not (value.is_conj() or value.is_neg())
        and str(value.dtype).removeprefix("torch.") in _RAW_DTYPES
        and value.numel() * value.element_size() >= DEVICE_MIN_BYTES
        and value.device in (torch.device("cpu"), device or (picked or [value])[0].device)
    ):
        picked.append(value)
        name = str(value.dtype).removeprefix("torch.")
        return {_DEVICE_KEY: len(picked) - 1, "dtype": name, "shape": list(value.shape)}
    if isinstance(value, (list, tuple)):
        walked = [_placeholders(v, picked, device, to_host) for v in value]
        return walked if isinstance(value, list) else tuple(walked)
    return to_host(value)


def _device_specs(value: Any) -> list[dict[str, Any]]:
    """The device placeholders in ``value`` (nested lists and tuples), in order, each once."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if type(v) is dict and _DEVICE_KEY in v:
            found.append(v)
        elif type(v) in (list, tuple):
            stack.extend(reversed(v))
    return found


def from_device(
    message: dict[str, Any],
    link: socket.socket | None,
    max_bytes: int,
    device: Any,
    host_bytes: int = 0,
) -> Any:
    """``message["outputs"]`` with each device placeholder replaced by a copy of its bytes in
    the allocation whose descriptor came on ``link`` (:func:`import_tensors`). The
    placeholders are checked as the channel checks its own (numbered in order, known element
    types, at most ``max_bytes`` in all with the ``host_bytes`` of the message that carried
    them), each must lie where :func:`span` puts it, and the allocation's size must cover them
    (with at most 64 MiB to spare for the driver's granularity).

    Raises:
        MessageTooLarge: more than ``max_bytes``.
        ValueError: malformed placeholders, no descriptor or one of no device, or no CUDA
            ``device`` to put them on: the sender's doing.
        HandoffError: the driver refused the descriptor or a copy.
    """
    specs = _device_specs(message["outputs"])
    parsed: list[tuple[torch.dtype, list[int], int]] = []
    for i, spec in enumerate(specs):
        name = spec.get("dtype")
        dtype = _RAW_DTYPES.get(name) if isinstance(name, str) else None
        shape, offset = spec.get("shape"), spec.get("offset")
        if (
            set(spec) != {_DEVICE_KEY, "dtype", "shape", "offset"}
            or type(spec[_DEVICE_KEY]) is not int
            or spec[_DEVICE_KEY] != i
            or dtype is None
            or type(shape) is not list
            or len(shape) > 64
            or not all(type(d) is int and 0 <= d < 1 << 48 for d in shape)
            or type(offset) is not int
        ):
            raise ValueError("its outputs did not arrive whole (a malformed device placeholder)")
        parsed.append((dtype, shape, offset))
    nbytes = [math.prod(shape) * dtype.itemsize for dtype, shape, _ in parsed]
    if sum(nbytes) + host_bytes > max_bytes:
        raise MessageTooLarge(sum(nbytes) + host_bytes, max_bytes)
    offsets, end = span(nbytes)
    if not parsed or [o for _, _, o in parsed] != offsets:
        raise ValueError("its outputs did not arrive whole (device placeholders out of place)")
    size = message.get("device_bytes")
    if type(size) is not int or not end <= size <= end + (64 << 20):
        raise ValueError("its outputs did not arrive whole (a wrong device allocation size)")
    if getattr(device, "type", None) != "cuda":
        raise ValueError("it sent device memory to a worker without a GPU")
    fd = _take_fd(link)
    try:
        tensors = import_tensors(fd, size, parsed, device)
    finally:
        os.close(fd)
    return _filled(message["outputs"], {id(spec): t for spec, t in zip(specs, tensors)})


def _filled(value: Any, by_spec: dict[int, torch.Tensor]) -> Any:
    """``value`` with each placeholder whose id is in ``by_spec`` replaced by its tensor (a
    module function: a closure that calls itself would keep them in a reference cycle)."""
    if type(value) is dict and id(value) in by_spec:
        return by_spec[id(value)]
    if type(value) in (list, tuple):
        return type(value)(_filled(v, by_spec) for v in value)
    return value


def _take_fd(link: socket.socket | None) -> int:
    """The one descriptor the writer sent on ``link`` before its message (any more closed).

    Raises:
        ValueError: none came.
    """
    fds = array.array("i")
    if link is not None:
        try:
            _, ancillary, _, _ = link.recvmsg(
                1,
                socket.CMSG_SPACE(4 * fds.itemsize),
                socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC,
            )
        except OSError:
            ancillary = []
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    for extra in fds[1:]:
        os.close(extra)
    if not fds:
        raise ValueError("its outputs did not arrive whole (no device memory came with them)")
    return fds[0]
