"""The rows the results store hands back: a run with its counts, and a stored verdict.

Made by :class:`kerneljudge.suite.store.ResultsStore` (and importable from there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kerneljudge.suite.metrics import Sample
from kerneljudge.suite.migrations import speedup_columns
from kerneljudge.verdict import Verdict

__all__ = ["RunInfo", "StoredVerdict"]


@dataclass(frozen=True)
class RunInfo:
    """One run's row, with its counts.

    Attributes:
        state: ``running``, ``finished`` (every planned pair judged), ``incomplete`` (run to
            the end, some pairs left undone: they cannot be judged where it ran) or
            ``interrupted`` (stopped before the end).
        owner: ``host:pid`` of the process that last ran it.
        spec: what was run (suite, candidates folder, layout, judge options); JSON-ready.
        planned: pairs planned over the suite; judged: verdicts stored; correct: of those.
    """

    run_id: str
    created_at: str
    updated_at: str
    state: str
    owner: str
    model: str
    sampling: dict[str, Any]
    metadata: dict[str, Any]
    spec: dict[str, Any]
    device: str
    versions: dict[str, str]
    problems: int
    planned: int
    judged: int
    correct: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StoredVerdict:
    """One stored verdict row; :attr:`verdict` rebuilds the typed :class:`Verdict`."""

    id: int
    run_id: str
    problem: str
    level: int | None
    tags: tuple[str, ...]
    sample: str
    candidate_path: str
    candidate_source: str
    candidate_sha256: str
    backend: str
    status: str
    verdict_json: str
    device: str
    versions: dict[str, str]
    started_at: str
    finished_at: str
    stored_at: str
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    transcript: list[Any] | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict.from_json(self.verdict_json)

    def to_dict(self, *, source: bool = True) -> dict[str, Any]:
        """A JSON-ready dict; the verdict as a nested object."""
        out = {k: v for k, v in self.__dict__.items() if k != "verdict_json"}
        out["tags"] = list(self.tags)
        out["verdict"] = json.loads(self.verdict_json)
        if not source:
            out.pop("candidate_source")
        return out

    def replays_missing(self) -> bool:
        """Timed by launched calls but without a graph replays' eager speedup (either side not
        captured, a CPU device, graph timing off)."""
        graph = speedup_columns(json.loads(self.verdict_json), "graph")
        return self.speedup is not None and graph[0] is None

    def as_sample(self, timing: str = "launched") -> Sample:
        """This verdict as the metrics see it, by its launched calls' eager speedup (the
        stored columns) or, with ``timing="graph"``, by its graph replays'
        (:func:`~kerneljudge.suite.migrations.speedup_columns`) where it has them, else by its
        launched calls' (:meth:`replays_missing`).

        Raises:
            ValueError: another ``timing``.
        """
        med, lo, hi = self.speedup, self.speedup_lo, self.speedup_hi
        if timing != "launched":
            graph = speedup_columns(json.loads(self.verdict_json), timing)
            med, lo, hi = (med, lo, hi) if graph[0] is None else graph
        return Sample(
            problem=self.problem,
            correct=self.status == "correct",
            speedup=med,
            ci95=(lo, hi) if lo is not None and hi is not None else None,
            level=self.level,
            tags=self.tags,
        )
