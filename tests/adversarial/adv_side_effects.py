"""What the adversarial suite checks around a verdict besides its status: the reports candidates
write (breaches, secrets seen, pids started), processes they left running, reference workers left
stopped, and build-cache entries of the correct baselines that a candidate rewrote.

The suite's environment: KJ_ADV_DIR (a private folder for reports), KJ_ADV_ROOT, KJ_ADV_CANARY
(see run_suite.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from kerneljudge.candidate import Candidate
from kerneljudge.judge import Judge
from kerneljudge.worker.sandbox import child_pids


def mark_files(adv_dir: Path, judge: Judge, case: Any) -> list[Path]:
    """Where a candidate's reports land: ``kj_adv/<tag>.jsonl`` in its own build folder (its
    TORCH_EXTENSIONS_DIR, which the worker lets it write), or ``<tag>.jsonl`` in KJ_ADV_DIR."""
    paths = [adv_dir / f"{case.name}.jsonl"]
    try:
        cand = Candidate.from_file(case.path)
        device = "cuda" if case.path.parent.name == "gpu" else "cpu"
        key = judge.cache.key(cand, judge.arch_for(device))
        paths.append(judge.cache.entry(key) / "ext" / "kj_adv" / f"{case.name}.jsonl")
    except Exception:  # noqa: BLE001 - a report location we cannot compute is no report
        pass
    return paths


def read_marks(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def clear_marks(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def judge_worker_pids(judge: Judge | None) -> set[int]:
    """Pids of the workers the judge itself holds (reference workers, idle pool workers)."""
    pids: set[int] = set()
    if judge is None:
        return pids
    for ref in judge.reference.sessions.values():
        pids.add(ref.worker.proc.pid)
    for pool in getattr(judge, "_pools", {}).values():
        for w in getattr(pool, "_idle", []):
            pids.add(w.proc.pid)
    # A worker runs below the process the judge started (its PID namespace's launcher).
    return pids | {c for p in pids for c in child_pids(p)}


def stray_processes(adv_dir: Path, judges: list[Judge | None]) -> list[tuple[int, str]]:
    """Processes that carry this run's KJ_ADV_DIR in their environment (so they descend from this
    suite) but are neither this process nor a worker a live judge holds: leftovers of a
    candidate."""
    needle = f"KJ_ADV_DIR={adv_dir}".encode()
    keep = {os.getpid()}
    for j in judges:
        keep |= judge_worker_pids(j)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in keep:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if needle not in env:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                found.append((int(d), cmd[:120]))
        except (OSError, IndexError):
            continue
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def resume_references(judge: Judge | None) -> None:
    """Safety net against a candidate that left the reference worker stopped (SIGSTOP)."""
    if judge is None:
        return
    for ref in judge.reference.sessions.values():
        try:
            os.kill(ref.worker.proc.pid, signal.SIGCONT)
        except OSError:
            pass


def heal_cache(judge: Judge, baselines: list[Any]) -> list[str]:
    """Cached baseline sources rewritten by a candidate: report them and drop the entries."""
    notes = []
    for case in baselines:
        cand = Candidate.from_file(case.path)
        try:
            key = judge.cache.key(cand, judge.arch_for(None))
        except Exception:  # noqa: BLE001 - toolchain probing must not stop the suite
            continue
        entry = judge.cache.entry(key)
        src = entry / "candidate.py"
        if src.is_file() and src.read_text() != cand.source:
            notes.append(f"cache entry of {case.path.name} was rewritten by a candidate")
            shutil.rmtree(entry, ignore_errors=True)
    return notes


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/PID/stat`` gives start times in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def marked_alive(marked: list[int], since_ticks: int, judges: list[Judge | None]) -> list[int]:
    """Host pids of live processes a candidate reported (pids as the candidate saw them: in its
    worker's PID namespace, where there is one), started while it was judged and not a worker
    a live judge holds. A pid the candidate saw matches a host process whose innermost
    namespace pid (``NSpid`` in ``/proc/PID/status``) is that number; a namespaced one only
    if it descends from this process (every namespace numbers its processes from 1: another
    program's judge on the same host has a pid 8 too, and a process cannot leave its PID
    namespace, whose first process this process started)."""
    if not marked:
        return []
    keep = {os.getpid()}
    for j in judges:
        keep |= judge_worker_pids(j)
    wanted = set(marked)
    ours = set(child_pids(os.getpid()))
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in keep or not alive(int(d)):
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                nspid = next(ln for ln in f if ln.startswith("NSpid:")).split()[1:]
            with open(f"/proc/{d}/stat") as f:
                started = int(f.read().rsplit(")", 1)[1].split()[19])
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        if int(nspid[-1]) in wanted and started >= since_ticks:
            if len(nspid) > 1 and int(d) not in ours:
                continue
            found.append(int(d))
    return found
