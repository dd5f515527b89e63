# expected: runtime_error|rejected
# kind: opening a network connection through libc aliases (ctypes __socket/__connect), 127.0.0.1
# problem: problem_cpu.py
"""Like fault_network, but forward connects through ctypes calls of libc's aliases __socket and
__connect: no Python socket audit event fires, and a deny-list of libc names (socket, connect)
does not name them. The listening end (127.0.0.1, ephemeral port) is set up in ModelNew.__init__
with the plain socket module. Only the loopback address is used. A sandbox that confines the
process (network namespace, seccomp) makes the socket or the connection fail (-> runtime_error)."""

import ctypes
import json
import os
import socket
import struct

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_network_ctypes"


def _mark(**facts):
    """Report to run_suite.py: a JSON line in this candidate's own build folder
    ($TORCH_EXTENSIONS_DIR, which the worker lets it write and the suite reads afterwards), else
    in $KJ_ADV_DIR. Plain Python file APIs into an allowed folder: reporting never changes the
    verdict."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv")
    try:
        os.makedirs(os.path.join(base, "kj_adv"), exist_ok=True)
        with open(os.path.join(base, "kj_adv", TAG + ".jsonl"), "a") as f:
            f.write(json.dumps(facts) + "\n")
    except OSError:
        pass


def _connect_raw(port: int) -> bytes:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.__socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "socket")
    try:
        addr = (
            struct.pack("<H", socket.AF_INET)
            + struct.pack(">H", port)
            + socket.inet_aton("127.0.0.1")
            + bytes(8)
        )
        if libc.__connect(fd, addr, len(addr)) < 0:  # the kernel completes it: listen backlog
            raise OSError(ctypes.get_errno(), "connect")
        return b"connected to 127.0.0.1:%d" % port
    finally:
        os.close(fd)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.port = None
        self.srv = None
        try:  # test scaffolding: the listening end (never accepts: the backlog completes connects)
            self.srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.srv.bind(("127.0.0.1", 0))
            self.srv.listen(4)
            self.port = self.srv.getsockname()[1]
        except OSError:
            pass

    def forward(self, x):
        if self.port is not None:
            port, self.port = self.port, None
            data = _connect_raw(port)  # no try: a sandbox's refusal is the expected outcome
            _mark(breach=f"TCP connection to 127.0.0.1 through libc aliases worked: {data!r}")
        return F.gelu(self.linear(x))
