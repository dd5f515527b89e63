"""Where the time and memory of an episode run go (a measurement, not a test).

::

    PYTHONPATH=$PWD/src python tests/agent/measure_runs.py --episodes 8 --concurrency 4 [--judges 2]

Runs ``run_episodes`` on the smoke problem (run_correctness, then submit_kernel of the smoke
candidate; CPU, eager baseline, 2 trials, 0.3 s of timing) against the loopback scripted server
(fake_server.py: replies take no time) and prints one JSON line: wall time, episodes a minute,
the device lock's time held and waited for (summed over threads), worker processes started by
role, and the peak resident memory of this process and its descendants by kind (sampled every
0.25 s). ``--src DIR`` measures another checkout's ``src`` (e.g. ``git archive`` of an earlier
commit); its runner is driven through the same ``run_episodes`` call.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _tree_rss(root: int) -> collections.Counter[str]:
    """Resident memory (bytes) of ``root`` and its descendants, by worker role."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(entry))
    by: collections.Counter[str] = collections.Counter()
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        rss = next((int(x.split()[1]) * 1024 for x in status if x.startswith("VmRSS")), 0)
        role = "supervisor" if pid == root else "other"
        if b"--role" in cmd:
            role = cmd[cmd.index(b"--role") + 1].decode() + " workers"
        by[role] += rss
    return by


class _TimedLock:
    """A lock that sums the time it was held and waited for."""

    def __init__(self, inner: Any, stats: collections.Counter[str]) -> None:
        self.inner, self.stats, self._t = inner, stats, 0.0

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        t0 = time.monotonic()
        ok = self.inner.acquire(*args, **kwargs)
        self.stats["wait_s"] += time.monotonic() - t0
        self._t = time.monotonic()
        return bool(ok)

    def release(self) -> None:
        self.stats["held_s"] += time.monotonic() - self._t
        self.inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--judges", type=int, default=0)
    parser.add_argument("--src", default=str(REPO / "src"))
    args = parser.parse_args()
    sys.path[:0] = [args.src, str(HERE)]
    os.environ["PYTHONPATH"] = args.src  # the workers too

    from fake_server import FakeServer, Reply, by_turn

    import kerneljudge.env._context as context
    import kerneljudge.worker.process as process
    from kerneljudge.agent import RunnerConfig, run_episodes
    from kerneljudge.env import EnvConfig

    stats: collections.Counter[str] = collections.Counter()
    spawns: collections.Counter[str] = collections.Counter()
    session_init, worker_init = context.JudgeSession.__init__, process.WorkerProcess.__init__

    def timed_session(self: Any, *a: Any, **k: Any) -> None:
        session_init(self, *a, **k)
        if not isinstance(self.lock, _TimedLock):
            self.lock = _TimedLock(self.lock, stats)
        self.judge.device_lock = self.lock

    def counted_worker(self: Any, role: str, *a: Any, **k: Any) -> None:
        spawns[role] += 1
        worker_init(self, role, *a, **k)

    context.JudgeSession.__init__ = timed_session  # type: ignore[method-assign]
    process.WorkerProcess.__init__ = counted_worker  # type: ignore[method-assign]

    peak: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = _tree_rss(os.getpid())
            if sum(now.values()) > sum(peak.values()):
                peak.clear()
                peak.update(now)
            time.sleep(0.25)

    smoke = REPO / "tests" / "fixtures" / "smoke"
    code = {"kernel_code": (smoke / "candidate.py").read_text()}
    script = by_turn([Reply("", [("run_correctness", code)]), Reply("", [("submit_kernel", code)])])
    out = Path(tempfile.mkdtemp(prefix="kj-measure-"))
    config = EnvConfig(
        device="cpu",
        baselines=("eager",),
        trials=2,
        submit_trials=2,
        benchmark_time_s=0.3,
        submit_time_s=0.3,
        cache_dir=str(out / "cache"),
    )
    kwargs: dict[str, Any] = {"episodes": args.episodes, "concurrency": args.concurrency}
    if "judges" in inspect.signature(run_episodes).parameters:
        kwargs["judges"] = args.judges
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    try:
        with FakeServer(script) as server:
            runner = RunnerConfig(model="scripted", base_url=server.base_url)
            summaries = run_episodes(
                [str(smoke / "problem.py")], runner, config, out_dir=out / "run", **kwargs
            )
    finally:
        wall = time.monotonic() - t0
        done.set()
        shutil.rmtree(out, ignore_errors=True)
    gb = 2**30
    print(
        json.dumps(
            {
                "src": args.src,
                **kwargs,
                "wall_s": round(wall, 1),
                "episodes_per_min": round(60 * args.episodes / wall, 2),
                "device_lock_held_s": round(stats["held_s"], 1),
                "device_lock_waited_s": round(stats["wait_s"], 1),
                "workers_started": dict(spawns),
                "peak_rss_gb": round(sum(peak.values()) / gb, 2),
                "peak_rss_gb_by_kind": {k: round(v / gb, 2) for k, v in sorted(peak.items())},
                "statuses": sorted({s.status for s in summaries}),
            }
        )
    )


if __name__ == "__main__":
    main()
