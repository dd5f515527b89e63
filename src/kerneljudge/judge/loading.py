"""The candidate's import in its worker: the load stage of a verdict."""

from __future__ import annotations

import dataclasses

from kerneljudge.build import BuildCache, clear_stale_batons, toolchain_environment
from kerneljudge.build.log import shape_log
from kerneljudge.candidate import Candidate
from kerneljudge.candidate.backends import IMPORT_ONLY_BACKENDS
from kerneljudge.errors import first_line
from kerneljudge.verdict import BuildResult, CompilerMessage
from kerneljudge.worker import CandidateFault, WorkerProcess

__all__ = ["load_candidate"]


def load_candidate(
    cache: BuildCache,
    worker: WorkerProcess,
    cand: Candidate,
    result: BuildResult,
    arch: str,
    limit_s: float,
) -> BuildResult | None:
    """Import the built candidate (``result``, from ``cache``, built for ``arch``) in its
    worker, within ``limit_s`` seconds.

    Returns None on success. For backends whose build *is* the import (``torch``, ``triton``) an
    import failure is a compile error: the failed :class:`BuildResult` is returned.

    Raises:
        CandidateFault: the import failed for a compiled backend (a runtime error), or the
            candidate was rejected while it was imported.
    """
    entry = cache.entry(result.cache_key)
    clear_stale_batons(cache, result.cache_key)
    try:
        worker.request(
            "load_candidate",
            limit_s,
            path=str(entry / "candidate.py"),
            env=toolchain_environment(cache, result.cache_key, arch),
        )
    except CandidateFault as exc:
        if cand.backend not in IMPORT_ONLY_BACKENDS or exc.status == "rejected":
            raise
        text = str(exc).removeprefix("importing the candidate failed: ")
        msg = CompilerMessage(cand.name, exc.lineno, None, "error", first_line(text), exc.lineno)
        log = shape_log([msg], text, cand.source, cand.name)
        return dataclasses.replace(result, ok=False, messages=(msg,), log=log)
    return None
