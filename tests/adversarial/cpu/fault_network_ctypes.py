# expected: runtime_error|rejected
# kind: opening a network connection through libc (ctypes), 127.0.0.1 only
# problem: problem_cpu.py
"""Like fault_network, but socket/bind/listen/connect/accept are called through ctypes on libc,
so no Python audit event fires. Only the loopback address is used. A sandbox that confines the
process (network namespace, seccomp) makes socket() fail (-> runtime_error)."""

import ctypes
import json
import os
import socket
import struct

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_network_ctypes"
_libc = ctypes.CDLL(None, use_errno=True)


def _mark(**facts):
    """Report to run_suite.py. Written through a raw libc open(), which the worker's audit hook
    does not see, so that reporting never changes the verdict; under a real sandbox it fails
    quietly and the breach it would report did not happen."""
    path = os.path.join(os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv"), TAG + ".jsonl")
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if fd >= 0:
            os.write(fd, (json.dumps(facts) + "\n").encode())
            os.close(fd)
    except Exception:  # noqa: BLE001
        pass


def _check(rc, what):
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def _sockaddr(port: int) -> bytes:
    return (
        struct.pack("<H", socket.AF_INET)
        + struct.pack(">H", port)
        + socket.inet_aton("127.0.0.1")
        + bytes(8)
    )


def _loopback_roundtrip() -> bytes:
    srv = _check(_libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0), "socket")
    cli = -1
    try:
        addr = _sockaddr(0)
        _check(_libc.bind(srv, addr, len(addr)), "bind")
        _check(_libc.listen(srv, 1), "listen")
        buf = ctypes.create_string_buffer(16)
        size = ctypes.c_uint32(16)
        _check(_libc.getsockname(srv, buf, ctypes.byref(size)), "getsockname")
        port = struct.unpack(">H", buf.raw[2:4])[0]
        cli = _check(_libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0), "socket")
        addr = _sockaddr(port)
        _check(_libc.connect(cli, addr, len(addr)), "connect")  # completes against the backlog
        conn = _check(_libc.accept(srv, None, None), "accept")
        os.write(conn, b"hello over raw libc sockets")
        data = os.read(cli, 100)
        os.close(conn)
        return data
    finally:
        os.close(srv)
        if cli >= 0:
            os.close(cli)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.done = False

    def forward(self, x):
        if not self.done:
            self.done = True
            data = _loopback_roundtrip()  # no try: a sandbox's refusal is the expected outcome
            _mark(breach=f"TCP connection to 127.0.0.1 through libc worked: {data!r}")
        return F.gelu(self.linear(x))
