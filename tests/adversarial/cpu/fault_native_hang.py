# expected: timeout
# kind: host-side hang in native code (GIL released, signals ignored)
# problem: problem_cpu.py
"""Blocks in native code with SIGTERM/SIGINT ignored: only SIGKILL can end it."""

import signal
import time

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        time.sleep(10_000)
        return x
