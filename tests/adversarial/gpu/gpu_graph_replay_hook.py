# expected: correct|rejected|incorrect
# kind: graph replay cheat (the captured graph is empty; a global replay hook computes the output)
# problem: ../fixtures/causal_gqa_any_kernel.py
# speedup_max_vs_baseline: 3
"""Honest when called. While it is captured, forward records nothing (an empty graph returning
an unwritten tensor) and leaves the inputs and that tensor to a global replay-start hook
(``torch.cuda.graphs.register_graph_replay_start_hook``, where torch has it), which computes
the output before torch's Python ``CUDAGraph.replay`` launches the graph: a replay timed through
that method would time an empty graph. The judge replays through the C-level function, which
runs no hooks, so the capture check sees the unwritten output and the candidate is timed by its
launched calls alone."""

import torch
import torch.nn as nn
import torch.nn.functional as F

_pending: list = []


def attention(q, k, v):
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    return o.transpose(1, 2).contiguous()


def _hook(graph) -> None:
    for out, args in _pending:
        with torch.no_grad():
            out.copy_(attention(*args))


_register = getattr(torch.cuda.graphs, "register_graph_replay_start_hook", None)
if _register is not None:
    try:
        _register(_hook)
    except Exception:  # noqa: BLE001 - another torch: the cheat is an empty graph alone
        pass


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        if torch.cuda.is_current_stream_capturing():
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            _pending[:] = [(out, (q, k, v))]
            return out
        return attention(q, k, v)
