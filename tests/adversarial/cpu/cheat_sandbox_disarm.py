# expected: runtime_error|rejected
# kind: switching off the worker's in-process sandbox (patching its audit-hook policy)
# problem: problem_cpu.py
# breach_fails: yes
"""An audit hook cannot be removed, but the policy it consults lives in the candidate's own
process: kerneljudge.worker.sandbox.Sandbox._refuse becomes a no-op (nothing is refused or
recorded), then the candidate writes outside its scratch folder and opens a loopback TCP
connection with the plain Python APIs, and computes honestly."""

import json
import os
import secrets
import socket
import sys
import threading

import torch.nn as nn
import torch.nn.functional as F

TAG = "cheat_sandbox_disarm"


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


_sb = sys.modules.get("kerneljudge.worker.sandbox")
if _sb is not None and hasattr(_sb, "Sandbox"):
    _sb.Sandbox._refuse = lambda self, what: None


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
                conn.sendall(b"hello")
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
            path = os.path.join(
                os.environ.get("KJ_ADV_DIR", "/tmp/kj_adv"), f"kj_escape_{secrets.token_hex(4)}"
            )
            with open(path, "w") as f:
                f.write("written after disarming the sandbox\n")
            data = _loopback_roundtrip()
            _mark(
                files=[path],
                breach=f"sandbox disarmed: wrote {path} and connected to 127.0.0.1 ({data!r})",
            )
        return F.gelu(self.linear(x))
