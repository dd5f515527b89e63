# expected: runtime_error|rejected
# kind: opening a network connection (127.0.0.1 only)
# problem: problem_cpu.py
"""Listens on 127.0.0.1 (an ephemeral port) and connects to it from the same process, then
computes correctly. Only the loopback address is ever used. A sandbox without network should
make socket()/bind()/connect() fail (-> runtime_error), or the judge should reject."""

import json
import os
import socket
import threading

import torch.nn as nn
import torch.nn.functional as F

TAG = "fault_network"


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


def _loopback_roundtrip() -> bytes:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.settimeout(5)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        try:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"hello from 127.0.0.1:%d" % port)
        except OSError:
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        data = c.recv(100)
    t.join(5)
    srv.close()
    return data


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.done = False

    def forward(self, x):
        if not self.done:
            self.done = True
            data = _loopback_roundtrip()  # no try: a sandbox's refusal is the expected outcome
            _mark(breach=f"TCP connection to 127.0.0.1 worked: {data!r}")
        return F.gelu(self.linear(x))
