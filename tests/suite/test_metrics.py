"""The metrics on hand-computed cases: pass@k's estimator, fast_p with ties by interval,
fast_p@k, the geometric mean, groups by level and tag."""

from __future__ import annotations

import math

import pytest

from kerneljudge.suite.metrics import Outcome, Sample, classify, compute_metrics, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        # 1 - C(n-c, k) / C(n, k), worked by hand:
        (2, 1, 1, 1 - 1 / 2),  # C(1,1)/C(2,1) = 1/2
        (5, 2, 2, 1 - 3 / 10),  # C(3,2)/C(5,2) = 3/10
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)/C(10,5) = 21/252
        (4, 0, 2, 0.0),  # no correct sample
        (3, 3, 2, 1.0),  # every sample correct
        (5, 4, 2, 1.0),  # n - c = 1 < k: any 2 of 5 hold a correct one
        (200, 1, 100, 0.5),  # C(199,100)/C(200,100) = 100/200
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_pass_at_k_equals_the_binomial_ratio_where_binomials_are_huge() -> None:
    n, c, k = 1000, 7, 300
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact, then one division
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 4, 1), (3, 1, 0), (3, -1, 1)])
def test_pass_at_k_refuses_undefined_cases(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _s(problem: str, correct: bool, ci: tuple[float, float] | None = None, **kw) -> Sample:
    med = None if ci is None else (ci[0] + ci[1]) / 2
    return Sample(problem, correct, med, ci, **kw)


def test_a_speedup_whose_interval_contains_p_is_a_tie() -> None:
    assert classify(_s("a", True, (1.2, 1.8)), 1.0) is Outcome.WIN  # lo > 1
    assert classify(_s("a", True, (0.9, 1.3)), 1.0) is Outcome.TIE  # 0.9 <= 1 <= 1.3
    assert classify(_s("a", True, (1.0, 1.3)), 1.0) is Outcome.TIE  # lo == p: not > p
    assert classify(_s("a", True, (0.5, 0.8)), 1.0) is Outcome.LOSS  # hi < 1
    assert classify(_s("a", True, (0.5, 0.8)), 0.0) is Outcome.WIN  # fast_0: correct
    assert classify(_s("a", False, (3.0, 4.0)), 1.0) is Outcome.LOSS  # incorrect
    assert classify(_s("a", True, None), 1.0) is Outcome.TIE  # untimed: unbounded interval
    assert classify(_s("a", True, None), 0.0) is Outcome.WIN


def test_fast_p_counts_wins_ties_and_losses_per_problem() -> None:
    # Four problems, one sample each, plus one problem with no candidate (a failure):
    #   a: correct, CI (1.6, 2.4)  -> p=1 win, p=1.5 win, p=2 tie
    #   b: correct, CI (0.8, 1.2)  -> p=1 tie, p=1.5 loss, p=2 loss
    #   c: correct, CI (0.3, 0.5)  -> loss everywhere but p=0
    #   d: incorrect               -> loss everywhere
    #   e: no sample               -> loss everywhere
    problems = {name: (1, ()) for name in "abcde"}
    samples = [
        _s("a", True, (1.6, 2.4)),
        _s("b", True, (0.8, 1.2)),
        _s("c", True, (0.3, 0.5)),
        _s("d", False),
    ]
    (g,) = compute_metrics(problems, samples, ks=(1,))
    assert (g.problems, g.samples, g.correct) == (5, 4, 3)
    assert g.correctness == pytest.approx(3 / 5)
    fast = {f.p: f for f in g.fast_p}
    assert fast[0.0].wins == pytest.approx(3 / 5) and fast[0.0].ties == 0
    assert (fast[1.0].wins, fast[1.0].ties, fast[1.0].losses) == pytest.approx(
        (1 / 5, 1 / 5, 3 / 5)
    )
    assert (fast[1.0].n_wins, fast[1.0].n_ties, fast[1.0].n_losses) == (1, 1, 2)
    assert (fast[1.5].wins, fast[1.5].ties) == pytest.approx((1 / 5, 0.0))
    assert (fast[2.0].wins, fast[2.0].ties) == pytest.approx((0.0, 1 / 5))
    # fast_p@1 is the wins share; with ties counted as wins it is the upper bound.
    assert fast[1.0].at_k[1] == pytest.approx(1 / 5)
    assert fast[1.0].at_k_with_ties[1] == pytest.approx(2 / 5)
    assert g.pass_at_k[1] == pytest.approx(3 / 5)
    # geomean over the correct candidates' medians 2.0, 1.0, 0.4: (2 * 1 * 0.4) ** (1/3)
    assert g.geomean_speedup == pytest.approx(0.8 ** (1 / 3))
    assert g.timed_correct == 3


def test_pass_at_k_and_fast_p_at_k_from_several_samples() -> None:
    # Problem x: 4 samples, 2 correct of which 1 wins at p=1 (CI above 1), 1 ties.
    # Problem y: 4 samples, none correct. Problem z: 2 samples only (left out of k=3).
    problems = {"x": (None, ()), "y": (None, ()), "z": (None, ())}
    samples = [
        _s("x", True, (1.5, 2.5)),
        _s("x", True, (0.9, 1.1)),
        _s("x", False),
        _s("x", False),
        *[_s("y", False) for _ in range(4)],
        _s("z", True, (3.0, 5.0)),
        _s("z", False),
    ]
    (g,) = compute_metrics(problems, samples, ps=(0.0, 1.0), ks=(1, 2, 3))
    # pass@1 = mean(c/n) = (2/4 + 0 + 1/2) / 3
    assert g.pass_at_k[1] == pytest.approx((0.5 + 0 + 0.5) / 3)
    # pass@2: x: 1 - C(2,2)/C(4,2) = 1 - 1/6; y: 0; z: 1 - C(1,2)/C(2,2) = 1 - 0 = 1
    assert g.pass_at_k[2] == pytest.approx((5 / 6 + 0 + 1) / 3)
    # pass@3: z (n=2) is left out; x: 1 - C(2,3)/C(4,3) = 1; y: 0
    assert g.pass_at_k[3] == pytest.approx(0.5)
    assert g.problems_at_k == {1: 3, 2: 3, 3: 2}
    fast1 = g.fast_p[1]
    # fast_1@2 with wins only: x has c=1 of n=4: 1 - C(3,2)/C(4,2) = 1/2; y 0; z c=1, n=2: 1
    assert fast1.at_k[2] == pytest.approx((0.5 + 0 + 1) / 3)
    # counting x's tie as a win: c=2 -> 5/6
    assert fast1.at_k_with_ties[2] == pytest.approx((5 / 6 + 0 + 1) / 3)
    # fast_1 (= fast_1@1): x 1/4 wins, 1/4 ties; z 1/2 wins
    assert (fast1.wins, fast1.ties) == pytest.approx(((0.25 + 0.5) / 3, 0.25 / 3))


def test_groups_by_level_and_by_tag() -> None:
    problems = {
        "a": (1, ("gemm",)),
        "b": (1, ("attention", "softmax")),
        "c": (2, ("softmax",)),
        "d": (None, ()),
    }
    samples = [_s("a", True, (2.0, 2.0)), _s("b", False), _s("c", True, (8.0, 8.0))]
    by_level = {g.group: g for g in compute_metrics(problems, samples, by="level", ks=(1,))}
    assert set(by_level) == {"level 1", "level 2", "level -"}
    assert by_level["level 1"].correctness == pytest.approx(0.5)
    assert by_level["level 2"].geomean_speedup == pytest.approx(8.0)
    assert by_level["level -"].correctness == 0.0  # d has no candidate
    by_tag = {g.group: g for g in compute_metrics(problems, samples, by="tag", ks=(1,))}
    assert by_tag["tag softmax"].problems == 2
    assert by_tag["tag softmax"].correctness == pytest.approx(0.5)
    assert by_tag["tag softmax"].geomean_speedup == pytest.approx(8.0)
    gemm_2 = by_tag["tag gemm"].fast_p[3]  # p=2: CI (2, 2) contains 2 -> a tie, not a win
    assert (gemm_2.wins, gemm_2.ties) == (0.0, 1.0)
    assert by_tag["tag gemm"].fast_p[2].wins == 1.0  # p=1.5: lo = 2 > 1.5
    with pytest.raises(ValueError):
        compute_metrics(problems, samples, by="model")
