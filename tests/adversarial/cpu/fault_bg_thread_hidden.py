# expected: rejected|runtime_error
# kind: thread that keeps running after the call, hidden from threading.enumerate()
# problem: problem_cpu.py
"""Like fault_bg_thread, but the thread is started with _thread.start_new_thread, so it never
registers with the threading module: a check of threading.enumerate() after the call misses it."""

import _thread
import time

import torch.nn as nn
import torch.nn.functional as F


def _linger():
    deadline = time.monotonic() + 600  # bounded: gone after 10 minutes whatever happens
    while time.monotonic() < deadline:
        time.sleep(0.05)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.started = False

    def forward(self, x):
        if not self.started:
            self.started = True
            _thread.start_new_thread(_linger, ())
        return F.gelu(self.linear(x))
