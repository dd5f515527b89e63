"""The worker's request loop: each request to its handler, each answer back on the channel.

Imports only the standard library and :mod:`kerneljudge.worker` modules.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from kerneljudge.worker.forward import Fault
from kerneljudge.worker.profiling import RequestProfiler
from kerneljudge.worker.protocol import Channel, ChannelClosed

__all__ = ["serve"]


def serve(chan: Channel, worker: Any, kernels: bool = False) -> int:
    """Say ``ready`` (with ``kernels``: whether the kernels the worker compiles at run time
    compiled or loaded, :func:`kerneljudge.worker.warming.warm_device`), then answer requests
    until ``exit`` or a closed pipe; returns the exit code.

    Each ``op`` goes to ``worker``'s ``op_<name>`` method (:class:`kerneljudge.worker.runtime.
    Worker`); a :class:`~kerneljudge.worker.forward.Fault` is answered as the candidate's
    fault, any other exception as the worker's own error with its traceback.
    """
    handlers = {
        name.removeprefix("op_"): getattr(worker, name)
        for name in dir(worker)
        if name.startswith("op_")
    }
    chan.send({"op": "ready", "pid": os.getpid(), "kernels": kernels})
    profiler = RequestProfiler()
    while True:
        try:
            msg = chan.recv()
        except ChannelClosed:
            return 0
        op = str(msg.get("op", ""))
        nonce = msg.get("nonce")
        if op == "exit":
            chan.send({"ok": True, "nonce": nonce})
            return 0
        handler = handlers.get(op)
        if handler is None:
            chan.send({"ok": False, "fault": False, "error": f"unknown op {op!r}", "nonce": nonce})
            continue
        try:
            with profiler.request(op):
                reply = handler(msg)
            reply["ok"] = True
        except Fault as exc:
            reply = {"ok": False, "fault": True, "error": str(exc)}
            reply.update(lineno=exc.lineno, status=exc.status)
        except BaseException as exc:  # noqa: BLE001 - report harness bugs, keep the traceback
            reply = {"ok": False, "fault": False, "error": traceback.format_exc(limit=8)}
            if isinstance(exc, KeyboardInterrupt):
                raise
        sys.stdout.flush()
        sys.stderr.flush()
        reply["nonce"] = nonce
        chan.send(reply)
