"""One timing pass's samplers: the ``time`` requests of each contestant, observed through the
workers' stamp sockets, with what the pass's rules read afterwards (:mod:`kerneljudge.timing.
stage`): the batches seen (for :func:`kerneljudge.timing.timer_rule.timer_check`), the candidate's
calls kept for the audit, and what was found tampered with.

A pass times launched calls (each timed call runs the forward) or, with ``graph``, replays of
each contestant's captured CUDA graph (:mod:`kerneljudge.worker.graphs`); everything else is
the same: per-call seeds drawn here after each window closed, outputs committed before the
audit slot is drawn, reported times checked against the wall time and the stamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerneljudge.timing import Sampler
from kerneljudge.timing.timer_rule import Batch
from kerneljudge.verdict import DeviceInfo
from kerneljudge.worker import WorkerProcess
from kerneljudge.worker.replies import TimeReply
from kerneljudge.worker.stamps import BatchObservation, Observer, Reservoir

__all__ = ["KeptCall", "Sampling", "observed", "request_edges"]


@dataclass(frozen=True)
class KeptCall:
    """A candidate call kept for the audit: its call index in its batch, the batch's input
    set count, its inputs' seed and its committed ``(kind, digest)`` per output."""

    index: int
    n_sets: int
    seed: int
    digests: tuple[tuple[int, bytes], ...]


def observed(obs: BatchObservation) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Windows of the timed calls and the worker's time between consecutive calls, warm-up
    ones included (the same loop), in ms: end mark to commit, then from the latest of the
    commit and the sending of the next call's seed and of this call's audit slot (the loop may
    wait for either) to the next start mark."""
    total = obs.warmup + obs.n
    calls = obs.calls
    timed = range(obs.warmup, total)
    windows = tuple((calls[i].end_ns - calls[i].start_ns) / 1e6 for i in timed)  # type: ignore[operator]
    gaps = tuple(
        (
            (calls[i].commit_ns - calls[i].end_ns)  # type: ignore[operator]
            + calls[i + 1].start_ns
            - max(calls[i].commit_ns, calls[i].next_seed_ns, calls[i].slot_ns or 0)  # type: ignore[type-var]
        )
        / 1e6
        for i in range(total - 1)
        if calls[i].next_seed_ns is not None
    )
    return windows, gaps


def request_edges(obs: BatchObservation) -> tuple[tuple[float, ...], tuple[float, float]]:
    """The warm-up calls' windows, and the wall time (ms) from the request to the first call's
    start mark and from the last call's end mark to the reply; ``((), (0, 0))`` where a
    stamp is missing."""
    calls = [obs.calls.get(i) for i in range(obs.warmup + obs.n)]
    if (
        not calls
        or obs.request_ns is None
        or obs.reply_ns is None
        or any(c is None or c.start_ns is None or c.end_ns is None for c in calls)
    ):
        return (), (0.0, 0.0)
    lead = tuple((c.end_ns - c.start_ns) / 1e6 for c in calls[: obs.warmup])  # type: ignore[operator,union-attr]
    before = (calls[0].start_ns - obs.request_ns) / 1e6  # type: ignore[operator,union-attr]
    after = (obs.reply_ns - calls[-1].end_ns) / 1e6  # type: ignore[operator,union-attr]
    return lead, (max(0.0, before), max(0.0, after))


class Sampling:
    """The samplers of one timing pass and what they saw.

    Attributes:
        seen: contestant -> its batches (:class:`~kerneljudge.timing.timer_rule.Batch`).
        reservoir: the candidate's timed calls kept for the audit (:class:`KeptCall` by slot).
        tampered: one sentence per reply that broke a rule (reported times, stamps).
        unstamped: contestants whose calls the kernel did not stamp.
    """

    def __init__(
        self,
        info: DeviceInfo,
        candidate: WorkerProcess,
        cores: tuple[int, ...],
        audited: int,
        flush_bytes: int,
        roll: bool,
        graph: bool = False,
    ) -> None:
        self.info, self.candidate, self.cores = info, candidate, cores
        self.flush_bytes, self.roll, self.graph = flush_bytes, roll, graph
        self.seen: dict[str, list[Batch]] = {}
        self.reservoir = Reservoir(audited)
        self.tampered: list[str] = []
        self.unstamped: list[str] = []
        self.pace: dict[str, float] = {}  # wall ms per call of each contestant's last request

    def sampler(
        self,
        request: Callable[..., dict[str, Any]],
        process: Callable[[], WorkerProcess],
        name: str,
        floor_s: float,
    ) -> Sampler:
        """The sampler of contestant ``name``, whose ``time`` requests go through ``request``
        to ``process()`` with ``floor_s`` as their limit's floor."""

        def sample(n: int, warmup: int) -> list[float]:
            # A request holds at most a quarter of the request limit at the wall time per call
            # seen so far (the loop's own work per call, outside the timed window, can be far
            # above a fast call's time); more calls go in further requests.
            per_call = self.pace.get(name)
            most = max(1, int(floor_s * 250.0 / per_call)) if per_call else n
            times: list[float] = []
            done = 0
            while done < n:
                chunk = min(most, n - done)
                got = self._one_request(
                    request, process, name, floor_s, chunk, warmup if done == 0 else 0
                )
                if len(got) != chunk:
                    return got if got else [float("nan")]
                times += got
                done += chunk
            return times

        return sample

    def _one_request(
        self,
        request: Callable[..., dict[str, Any]],
        process: Callable[[], WorkerProcess],
        name: str,
        floor_s: float,
        n: int,
        warmup: int,
    ) -> list[float]:
        cand = name == "candidate"
        cuda = self.info.kind == "cuda"
        if not cand:
            self.candidate.pause(True)  # nothing of the candidate runs while the reference is timed
        t0 = time.perf_counter()
        reservoir = self.reservoir
        extra = {"graph": True} if self.graph else {}
        try:
            reply, obs = Observer(process().stamps, self.cores).run(
                request,
                floor_s,
                n=n,
                warmup=warmup,
                keep=(lambda i: reservoir.offer()) if cand else (lambda i: -1),
                cpu_root=process().proc.pid if cand and not cuda else None,
                flush_bytes=self.flush_bytes,
                target=name,
                roll=self.roll,
                **extra,
            )
        finally:
            if not cand:
                self.candidate.pause(False)
        wall_ms = (time.perf_counter() - t0) * 1e3
        self.pace[name] = wall_ms / max(1, n + warmup)
        timed = TimeReply.decode(reply, process().role)
        times, n_sets = list(timed.times_ms), timed.n_sets
        if len(times) != n or not all(0 < x < float("inf") for x in times):
            self.tampered.append(f"{name} reported {len(times)} invalid times for {n} calls")
        elif sum(times) > wall_ms + 1.0:
            self.tampered.append(
                f"{name} reported {sum(times):.3f} ms of calls in {wall_ms:.3f} ms of wall time"
            )
        elif not obs.complete():
            self.tampered.append(f"{name}'s timed calls were not marked on the stamp socket")
        else:
            windows, gaps = observed(obs) if obs.stamped else ((), ())
            if not obs.stamped:
                self.unstamped.append(name)
            # CPU workers only: a GPU worker polls for the supervisor's answers and waits
            # for the device between calls, on the CPU.
            on_cpu = not cuda and obs.stamped
            trusted = timed.between_cpu_ms
            lead, edges = request_edges(obs)
            counted = on_cpu and cand and obs.cpu_ns is not None and bool(lead or not warmup)
            self.seen.setdefault(name, []).append(
                Batch(
                    n,
                    warmup,
                    wall_ms,
                    tuple(times),
                    windows,
                    gaps,
                    obs.cpu_ns / 1e6 if counted else None,  # type: ignore[operator]
                    len(self.cores),
                    trusted if on_cpu and not cand else (),
                    lead,
                    edges,
                )
            )
            for i, rec in obs.calls.items():
                if cand and rec.slot >= 0 and type(n_sets) is int:
                    digests = tuple(rec.digests or ())
                    reservoir.kept[rec.slot] = KeptCall(i, n_sets, rec.seed, digests)
        return times if times else [float("nan")]
