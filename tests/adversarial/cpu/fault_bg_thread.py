# expected: rejected|runtime_error
# kind: thread that keeps running after the call returns
# problem: problem_cpu.py
"""Starts a non-daemon thread that keeps running (it sleeps in short steps, so that it does not
distort timing), then returns a correct result. The worker cannot exit cleanly while it runs."""

import threading
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
        self.thread = None

    def forward(self, x):
        if self.thread is None:
            self.thread = threading.Thread(target=_linger, name="kj-adv-linger", daemon=False)
            self.thread.start()
        return F.gelu(self.linear(x))
