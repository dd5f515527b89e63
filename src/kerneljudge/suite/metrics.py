"""The field's metrics over a suite run: correctness, fast_p, pass@k, fast_p@k, geomean speedup.

Definitions (``docs/suites.md`` gives them with their sources):

* **pass@k** (Chen et al. 2021, *Evaluating Large Language Models Trained on Code*, eq. 1): with
  ``n`` samples of a problem of which ``c`` are correct, the unbiased estimate of the chance that
  at least one of ``k`` samples drawn without replacement is correct is
  ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1..n} (1 - k/i)`` (no large
  binomials); averaged over problems.
* **fast_p** (KernelBench, Ouyang et al. 2025): the share of problems whose candidate is correct
  AND runs faster than ``p`` times the reference, ``speedup > p``. ``fast_0`` is the correctness
  rate. With ``n`` samples per problem the share is averaged per problem (``fast_p@1``).
* **Ties**: a correct candidate whose speedup's 95% interval contains ``p`` (``lo <= p <= hi``)
  is neither faster nor slower than ``p`` on the evidence: it is a *tie*, counted apart. A
  correct candidate without a timed speedup has an unbounded interval: a tie for every
  ``p > 0``. The headline fast_p counts wins only (``lo > p``).
* **fast_p@k**: pass@k's estimator with ``c`` = the samples that win at ``p``.
* **geomean speedup**: ``exp(mean(log s))`` over the correct candidates' median eager speedups.

A problem of the suite with no judged candidate (``n = 0``) scores 0 everywhere; a problem with
``0 < n < k`` samples has no pass@k estimate and is left out of that k's mean (the count of
problems used is reported).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_PS",
    "GroupMetrics",
    "Outcome",
    "Sample",
    "classify",
    "compute_metrics",
    "geomean",
    "pass_at_k",
]

DEFAULT_PS: tuple[float, ...] = (0.0, 1.0, 1.5, 2.0)
DEFAULT_KS: tuple[int, ...] = (1, 5, 10)


class Outcome(str, Enum):
    """A candidate against the threshold ``speedup > p``."""

    WIN = "win"
    TIE = "tie"
    LOSS = "loss"


@dataclass(frozen=True)
class Sample:
    """One judged candidate as the metrics see it.

    Attributes:
        problem: the problem's name.
        correct: the verdict's status is ``correct``.
        speedup: median eager speedup (reference time / candidate time), None when not timed.
        ci95: the speedup's 95% interval ``(lo, hi)``, None when not timed.
        level: the problem's level (None when it has none).
        tags: the problem's tags.
    """

    problem: str
    correct: bool
    speedup: float | None = None
    ci95: tuple[float, float] | None = None
    level: int | None = None
    tags: tuple[str, ...] = ()


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021).

    Computed as ``1 - prod_{i=n-c+1..n} (1 - k/i)``, which equals the binomial ratio and stays
    exact in floating point for large ``n``.

    Raises:
        ValueError: ``k < 1``, ``c`` outside ``[0, n]``, or ``k > n``.
    """
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs k >= 1 and 0 <= c <= n (n={n}, c={c}, k={k})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples (n={n})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def classify(sample: Sample, p: float) -> Outcome:
    """Whether ``sample`` is faster than ``p`` (win), undecided at ``p`` (tie), or not (loss).

    Incorrect: loss. Correct and ``p <= 0``: win (every speedup is positive). Correct without
    a speedup interval: tie. Otherwise win when ``lo > p``, loss when ``hi < p``, else tie.
    """
    if not sample.correct:
        return Outcome.LOSS
    if p <= 0:
        return Outcome.WIN
    if sample.ci95 is None:
        return Outcome.TIE
    lo, hi = sample.ci95
    if lo > p:
        return Outcome.WIN
    if hi < p:
        return Outcome.LOSS
    return Outcome.TIE


def geomean(values: Iterable[float]) -> float | None:
    """``exp(mean(log v))`` over the positive ``values``; None when there are none."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


@dataclass(frozen=True)
class FastP:
    """fast_p at one threshold: shares (per-problem means, in [0, 1]) and raw sample counts.

    ``wins`` is the headline fast_p. ``at_k`` maps k -> fast_p@k (wins only) and
    ``at_k_with_ties`` k -> the same with ties counted as wins (an upper bound).
    """

    p: float
    wins: float
    ties: float
    losses: float
    n_wins: int
    n_ties: int
    n_losses: int
    at_k: dict[int, float | None] = field(default_factory=dict)
    at_k_with_ties: dict[int, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupMetrics:
    """The metrics of one group of problems (all, one level, or one tag).

    Attributes:
        group: ``all``, ``level <n>``, ``level -`` or ``tag <name>``.
        problems: problems in the group (including those with no judged candidate).
        samples: judged candidates.
        correct: correct candidates.
        correctness: mean over problems of ``c/n`` (0 for ``n = 0``); equals fast_0.
        fast_p: one :class:`FastP` per threshold.
        pass_at_k: k -> mean pass@k over the problems with ``n >= k`` or ``n = 0`` (None when
            no problem has ``k`` samples; also in :attr:`FastP.at_k`).
        problems_at_k: k -> how many problems that mean is over.
        geomean_speedup: geometric mean of the correct candidates' median speedups (None when
            no correct candidate was timed); ``timed_correct`` says over how many.
    """

    group: str
    problems: int
    samples: int
    correct: int
    correctness: float
    fast_p: tuple[FastP, ...]
    pass_at_k: dict[int, float | None]
    problems_at_k: dict[int, int]
    geomean_speedup: float | None
    timed_correct: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _estimate(per_problem: Sequence[tuple[int, int]], k: int) -> tuple[float | None, int]:
    """Mean pass@k over ``(n, c)`` pairs: n = 0 scores 0, 0 < n < k is left out; None when no
    problem has ``n >= k`` samples."""
    if not any(n >= k for n, _ in per_problem):
        return None, 0
    scores = [0.0 if n == 0 else pass_at_k(n, c, k) for n, c in per_problem if n == 0 or n >= k]
    return sum(scores) / len(scores), len(scores)


def _group(
    name: str,
    problems: Sequence[str],
    samples: Sequence[Sample],
    ps: Sequence[float],
    ks: Sequence[int],
) -> GroupMetrics:
    by_problem: dict[str, list[Sample]] = {p: [] for p in problems}
    for s in samples:
        by_problem.setdefault(s.problem, []).append(s)
    groups = list(by_problem.values())
    m = len(groups)

    def share(count: list[int]) -> float:
        return sum(c / len(g) for c, g in zip(count, groups) if g) / m if m else 0.0

    correct = [sum(s.correct for s in g) for g in groups]
    fast: list[FastP] = []
    for p in ps:
        outcomes = [[classify(s, p) for s in g] for g in groups]
        w = [o.count(Outcome.WIN) for o in outcomes]
        t = [o.count(Outcome.TIE) for o in outcomes]
        lo = [o.count(Outcome.LOSS) for o in outcomes]
        ns = [len(g) for g in groups]
        fast.append(
            FastP(
                p=p,
                wins=share(w),
                ties=share(t),
                losses=share(lo) + (sum(1 for g in groups if not g) / m if m else 0.0),
                n_wins=sum(w),
                n_ties=sum(t),
                n_losses=sum(lo),
                at_k={k: _estimate(list(zip(ns, w)), k)[0] for k in ks},
                at_k_with_ties={
                    k: _estimate([(n, a + b) for n, a, b in zip(ns, w, t)], k)[0] for k in ks
                },
            )
        )
    pairs = [(len(g), c) for g, c in zip(groups, correct)]
    estimates = {k: _estimate(pairs, k) for k in ks}
    timed = [s.speedup for s in samples if s.correct and s.speedup is not None]
    return GroupMetrics(
        group=name,
        problems=m,
        samples=sum(len(g) for g in groups),
        correct=sum(correct),
        correctness=share(correct),
        fast_p=tuple(fast),
        pass_at_k={k: v for k, (v, _) in estimates.items()},
        problems_at_k={k: used for k, (_, used) in estimates.items()},
        geomean_speedup=geomean(timed),
        timed_correct=len(timed),
    )


def compute_metrics(
    problems: dict[str, tuple[int | None, tuple[str, ...]]],
    samples: Sequence[Sample],
    *,
    by: str | None = None,
    ps: Sequence[float] = DEFAULT_PS,
    ks: Sequence[int] = DEFAULT_KS,
) -> list[GroupMetrics]:
    """The metrics of a run, overall (``by=None``) or per ``level`` or per ``tag``.

    Args:
        problems: every problem of the suite -> ``(level, tags)``; problems without samples
            count as failures.
        samples: the judged candidates.
        by: None, ``"level"`` or ``"tag"`` (a problem with several tags is in each tag's group).
        ps: fast_p thresholds.
        ks: pass@k / fast_p@k sample counts.

    Raises:
        ValueError: ``by`` is not one of those.
    """
    if by is None:
        return [_group("all", list(problems), samples, ps, ks)]
    if by not in ("level", "tag"):
        raise ValueError(f"--by must be level or tag, not {by!r}")
    keys: dict[str, list[str]] = {}
    for name, (level, tags) in problems.items():
        if by == "level":
            keys.setdefault(f"level {level if level is not None else '-'}", []).append(name)
        else:
            for tag in tags or ("-",):
                keys.setdefault(f"tag {tag}", []).append(name)

    def order(key: str) -> tuple[int, int, str]:
        tail = key.split(" ", 1)[1]
        return (0, int(tail), "") if tail.isdigit() else (1, 0, tail)

    out = []
    for key in sorted(keys, key=order):
        members = set(keys[key])
        out.append(_group(key, keys[key], [s for s in samples if s.problem in members], ps, ks))
    return out
