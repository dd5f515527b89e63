"""The build worker: imports a candidate with no GPU visible, so that its extensions compile.

Run by :func:`kerneljudge.build.build` as ``python -m kerneljudge.worker.build CANDIDATE RESULT``
with ``CUDA_VISIBLE_DEVICES`` empty and ``TORCH_EXTENSIONS_DIR`` set to the candidate's cache
entry. Importing the module runs its ``load_inline`` calls, which compile and link. The outcome
is written as JSON to ``RESULT``: ``{"ok": bool, "error": str, "lineno": int | None}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import traceback

from kerneljudge.worker.sandbox import Sandbox, child_pids, set_subreaper
from kerneljudge.worker.torchlog import drop_no_cuda_runtime_notice


def end_descendants() -> None:
    """SIGKILL every live descendant of this process (the tools the build started and what
    they started; orphans come back here, the subreaper). In a PID namespace the kernel does
    this anyway when the build worker's namespace ends; without one it is what ends them."""
    for pid in child_pids(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> int:
    candidate, result_path = argv[0], argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the supervisor's
    sys.dont_write_bytecode = True
    set_subreaper()
    drop_no_cuda_runtime_notice()  # no GPU is visible here, on purpose
    # Candidate code may write only inside its own cache entry (the working directory).
    sandbox = Sandbox([os.getcwd()])
    sandbox.install()
    sandbox.armed = True
    result: dict[str, object] = {"ok": True, "error": "", "lineno": None}
    try:
        spec = importlib.util.spec_from_file_location("candidate_module", candidate)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {candidate}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["candidate_module"] = module
        spec.loader.exec_module(module)
        if not hasattr(module, "ModelNew"):
            result = {
                "ok": False,
                "error": "the candidate does not define ModelNew",
                "lineno": None,
            }
    except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, even SystemExit
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == candidate]
        lineno = frames[-1].lineno if frames else getattr(exc, "lineno", None)
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "lineno": lineno}
    sandbox.armed = False
    end_descendants()
    violations = sandbox.take_violations()
    if violations:
        result = {
            "ok": False,
            "error": "the candidate attempted " + "; ".join(violations),
            "lineno": None,
            "rejected": True,
        }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
