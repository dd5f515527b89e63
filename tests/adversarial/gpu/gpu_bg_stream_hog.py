# expected: correct|rejected
# kind: background CUDA work while the candidate is idle (slows the reference on the shared GPU)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest SDPA. A background thread (started with _thread.start_new_thread, so
threading.enumerate() does not list it) keeps the GPU busy with large matmuls on a side stream
whenever this worker is idle, which is when the judge times the reference on the same device;
it stops while forward runs. The reference looks slower than it is."""

import _thread
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2).contiguous()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.busy = True
        self.last = time.monotonic()
        self.thread = None

    def _hog(self, device):
        stream = torch.cuda.Stream(device=device)
        a = torch.randn(4096, 4096, device=device)
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if self.busy or time.monotonic() - self.last < 0.002:
                time.sleep(0.0002)
                continue
            with torch.cuda.stream(stream):
                for _ in range(4):
                    a = (a @ a).tanh_()
            stream.synchronize()

    def forward(self, q, k, v):
        self.busy = True
        try:
            if self.thread is None:
                self.thread = _thread.start_new_thread(self._hog, (q.device,))
            return attention(q, k, v)
        finally:
            self.last = time.monotonic()
            self.busy = False
