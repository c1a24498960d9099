"""Exact benchmark metrics against brute-force and hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from mmreward.errors import RewardInputError
from vlm_rm.bench.bootstrap import bootstrap_ci, bootstrap_ratio_ci
from vlm_rm.bench.metrics import (
    inversion_accuracy,
    pairwise_accuracy,
    pickapic_credit,
    ranking_pair_counts,
    three_way_credit,
    tie_calibrated_accuracy,
    tie_calibrated_accuracy_sequential,
    tune_pickapic_threshold,
)


def published_loop(h, m):
    """The VideoGen-RewardBench sequential loop, re-written plainly from its description."""
    pairs = sorted(zip(h, m), key=lambda x: abs(x[1]))
    best, best_eps = -1.0, None
    for k in range(len(pairs)):
        tied = pairs[: k + 1]
        rest = pairs[k + 1 :]
        correct = sum(1 for hi, _ in tied if hi == 0) + sum(1 for hi, mi in rest if hi != 0 and hi * mi > 0)
        tau = correct / len(pairs)
        if tau > best:
            best, best_eps = tau, abs(pairs[k][1])
    return best, best_eps


def paper_accuracy_with_ties(h, m, eps):
    """Deutsch et al.'s acc_eq at one threshold, counted from their contingency table by hand.

    The model predicts a tie when its two scores are equal (m == 0) or |m| <= eps.
    """
    C = D = T_h = T_m = T_hm = 0
    for hi, mi in zip(h, m):
        model_tie = mi == 0 or abs(mi) <= eps
        if hi == 0 and model_tie:
            T_hm += 1
        elif hi == 0:
            T_h += 1
        elif model_tie:
            T_m += 1
        elif (hi > 0) == (mi > 0):
            C += 1
        else:
            D += 1
    return (C + T_hm) / (C + D + T_h + T_m + T_hm)


def brute_force_ties(h, m):
    """max over every threshold of acc_eq: "no new ties" (eps below every |m|) and each distinct |m|.

    Midpoints between consecutive |m| add nothing (they tie the same pairs as the lower value); they
    are enumerated anyway so that the candidate set itself is under test. The smallest eps attaining
    the maximum wins; "no new ties" is reported as eps = 0.0, as Deutsch et al.'s code does.
    """
    levels = sorted(set(abs(float(x)) for x in m))
    candidates = [float("-inf")] + levels + [(a + b) / 2 for a, b in zip(levels, levels[1:])]
    best, best_eps = -1.0, None
    for eps in sorted(candidates):
        acc = paper_accuracy_with_ties(h, m, eps)
        if acc > best:
            best, best_eps = acc, max(eps, 0.0)
    return best, best_eps


def test_tie_calibrated_tries_the_no_ties_threshold():
    # both pairs concordant: tying none of them is right (1.0); tying the smaller margin gives 0.5
    assert tie_calibrated_accuracy([1, 1], [0.5, 1.0]) == (1.0, 0.0)
    assert tie_calibrated_accuracy([1, -1, 1], [0.2, -0.3, 0.1]) == (1.0, 0.0)
    # a human tie with an exactly equal model score is a model tie at every threshold
    assert tie_calibrated_accuracy([0, 1], [0.0, 0.4]) == (1.0, 0.0)


def test_tie_calibrated_exact_matches_brute_force_with_repeated_margins():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        h = rng.choice([-1, 0, 1], n, p=rng.dirichlet(np.ones(3))).tolist()
        if rng.random() < 0.5:
            m = (rng.integers(-3, 4, n) * 0.5).tolist()  # discrete judge scores: many repeats, some zeros
        else:
            m = rng.normal(size=n).tolist()
        acc, eps = tie_calibrated_accuracy(h, m)
        want_acc, want_eps = brute_force_ties(h, m)
        assert acc == pytest.approx(want_acc, rel=1e-12) and eps == want_eps, (h, m)
        # the returned threshold reproduces the accuracy when applied as a 3-way classifier
        assert three_way_credit(h, m, eps).mean() == pytest.approx(acc, rel=1e-12)


def test_sequential_mode_reproduces_the_published_loop():
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = int(rng.integers(3, 40))
        h = rng.choice([-1, 0, 1], n).tolist()
        m = (rng.integers(-3, 4, n) * 0.5).tolist()
        assert tie_calibrated_accuracy_sequential(h, m) == pytest.approx(published_loop(h, m))
        # the loop never scores "no new ties", but every real threshold from |m| is among its cuts
        exact, eps = tie_calibrated_accuracy(h, m)
        if eps in np.abs(m):
            assert tie_calibrated_accuracy_sequential(h, m)[0] >= exact - 1e-12


def test_modes_agree_when_margins_are_distinct():
    rng = np.random.default_rng(2)
    h = rng.choice([-1, 0, 1], 50)
    m = rng.normal(size=50)
    assert tie_calibrated_accuracy(h, m) == pytest.approx(tie_calibrated_accuracy_sequential(h, m))


def test_sequential_loop_is_order_dependent_and_inflated_by_hand():
    # three pairs with the same margin 0.5: the real thresholds tie none (1 concordant of 3) or all
    # three (1 correct, the human tie, of 3); the smaller eps wins. The loop also scores "tie only
    # the first pair", which depends on input order.
    h, m = [1, -1, 0], [0.5, 0.5, 0.5]
    assert tie_calibrated_accuracy(h, m) == (pytest.approx(1 / 3), 0.0)
    assert tie_calibrated_accuracy([0, 1, -1], m)[0] == pytest.approx(1 / 3)
    assert tie_calibrated_accuracy_sequential(h, m)[0] == pytest.approx(1 / 3)
    # human tie first: tie it alone and keep the concordant pair -> 2 of 3
    assert tie_calibrated_accuracy_sequential([0, 1, -1], m)[0] == pytest.approx(2 / 3)


def test_pairwise_accuracy_zero_margin_policies_by_hand():
    h = [1, 1, -1, -1, 0]
    m = [2.0, 0.0, -1.0, 0.5, 3.0]  # right, model tie, right, wrong, human tie (excluded)
    assert pairwise_accuracy(h, m, "wrong") == pytest.approx(2 / 4)
    assert pairwise_accuracy(h, m, "half") == pytest.approx(2.5 / 4)
    assert pairwise_accuracy(h, m, "drop") == pytest.approx(2 / 3)
    with pytest.raises(RewardInputError, match="zero_margin"):
        pairwise_accuracy(h, m, "ignore")
    with pytest.raises(RewardInputError, match="finite"):
        pairwise_accuracy([1], [float("nan")])


def test_pickapic_credit_and_threshold_by_hand():
    labels = [1, 0, 0.5, 0.5]
    p0 = [0.9, 0.46, 0.52, 0.75]  # |p1 - p0| = 0.8, 0.08, 0.04, 0.5
    # threshold 0: predictions 0, 1, 0, 0 (by side) -> 1, 1, 0.5, 0.5
    assert pickapic_credit(labels, p0, 0.0).tolist() == [1.0, 1.0, 0.5, 0.5]
    # threshold 0.1: the second pair becomes a tie (0.5), the third too (1)
    assert pickapic_credit(labels, p0, 0.1).tolist() == [1.0, 0.5, 1.0, 0.5]
    best, curve = tune_pickapic_threshold(labels, p0)
    assert curve[0] == pytest.approx(3 / 4) and curve[1] == pytest.approx(3 / 4)
    # 0.5: ties for pairs 2-4 -> 1, 0.5, 1, 1 = 3.5 / 4, the first threshold reaching the max
    assert best == 0.5 and max(curve) == pytest.approx(3.5 / 4)
    with pytest.raises(RewardInputError, match="label_0"):
        pickapic_credit([0.3], [0.5], 0.0)


def test_ranking_metrics_by_hand():
    rank = [1, 2, 2, 3]
    scores = [4.0, 3.0, 3.0, 5.0]
    # pairs (i<j): (0,1) ok, (0,2) ok, (0,3) inverted, (1,2) human tie, (1,3) inverted, (2,3) inverted
    assert inversion_accuracy(rank, scores) == pytest.approx(1 - 3 / 6)
    assert ranking_pair_counts(rank, scores) == (2.0, 5.0)
    tied = [4.0, 3.0, 3.0, 3.0]  # (1,3) and (2,3) become model ties on human-ordered pairs
    assert inversion_accuracy(rank, tied, "wrong") == pytest.approx(1 - 2 / 6)
    assert inversion_accuracy(rank, tied, "half") == pytest.approx(1 - 1 / 6)
    assert inversion_accuracy(rank, tied, "drop") == pytest.approx(1.0)
    assert ranking_pair_counts(rank, tied, "half") == (4.0, 5.0)


def test_bootstrap_intervals_bracket_the_estimate_and_match_generic_version():
    rng = np.random.default_rng(3)
    x = rng.random(200)
    lo, hi = bootstrap_ratio_ci(x, n_boot=500, seed=0)
    assert lo < x.mean() < hi and hi - lo < 0.2
    glo, ghi = bootstrap_ci(lambda ix: float(x[ix].mean()), x.size, n_boot=500, seed=0)
    assert abs(glo - lo) < 0.02 and abs(ghi - hi) < 0.02
    assert bootstrap_ratio_ci(np.ones(10)) == (1.0, 1.0)


def test_pickapic_tie_boundary_is_exact_for_decimal_probabilities():
    # p0 = k/100 against thresholds t/10: |p1 - p0| <= t/10  <=>  |100 - 2k| <= 10 t, in integers.
    # (1 - p0) - p0 in floats lands on either side of the threshold (0.45 -> 0.10000000000000003).
    k = np.arange(101)
    p0 = k / 100
    for t in range(11):
        pred_tie = np.abs(100 - 2 * k) <= 10 * t
        want = np.where(pred_tie, 1.0, 0.5)  # every label is a human tie: 1 for a model tie, else 0.5
        assert pickapic_credit(np.full(k.size, 0.5), p0, t / 10).tolist() == want.tolist(), t
        # swapping the two images (label and probability) must not change any credit
        labels = np.where(k % 2 == 0, 1.0, 0.0)
        assert pickapic_credit(labels, p0, t / 10).tolist() == pickapic_credit(1 - labels, 1 - p0, t / 10).tolist()


def test_metrics_reject_non_finite_or_out_of_range_inputs():
    nan = float("nan")
    with pytest.raises(RewardInputError, match="h: human"):
        pairwise_accuracy([1, nan], [0.5, 0.5])
    with pytest.raises(RewardInputError, match="h: human"):
        tie_calibrated_accuracy([nan, 1], [0.5, 0.5])
    with pytest.raises(RewardInputError, match="eps"):
        three_way_credit([1], [0.5], nan)
    with pytest.raises(RewardInputError, match="prob_0"):
        pickapic_credit([1, 0], [0.5, nan], 0.1)
    with pytest.raises(RewardInputError, match="prob_0"):
        pickapic_credit([1, 0], [0.5, 1.5], 0.1)
    with pytest.raises(RewardInputError, match="threshold"):
        pickapic_credit([1], [0.5], nan)
    with pytest.raises(RewardInputError, match="no pairs"):
        tune_pickapic_threshold([], [])
    with pytest.raises(RewardInputError, match="scores"):
        inversion_accuracy([1, 2, 3], [0.1, nan, 0.3])
    with pytest.raises(RewardInputError, match="rank"):
        ranking_pair_counts([1, nan, 3], [0.1, 0.2, 0.3])


def test_ranking_metrics_match_a_pairwise_loop_with_ties():
    rng = np.random.default_rng(4)
    for _ in range(100):
        n = int(rng.integers(2, 9))
        rank = rng.integers(1, 4, n).tolist()  # few levels: many human ties
        scores = rng.integers(0, 3, n).astype(float).tolist()  # few levels: many model ties
        for policy, tie_inv in (("wrong", 1.0), ("half", 0.5), ("drop", None)):
            inv = total = correct = ordered = 0.0
            for i in range(n):
                for j in range(i + 1, n):
                    human = (rank[i] < rank[j]) - (rank[i] > rank[j])  # +1: i is better
                    model = (scores[i] > scores[j]) - (scores[i] < scores[j])
                    if human != 0 and model == 0:
                        if tie_inv is None:
                            continue
                        inv, total = inv + tie_inv, total + 1
                        correct, ordered = correct + 1 - tie_inv, ordered + 1
                        continue
                    total += 1
                    inv += human * model < 0
                    if human != 0:
                        correct, ordered = correct + (human == model), ordered + 1
            got = inversion_accuracy(rank, scores, policy)
            if total:
                assert got == pytest.approx(1 - inv / total, rel=1e-12), (rank, scores, policy)
            else:
                assert np.isnan(got)
            assert ranking_pair_counts(rank, scores, policy) == (pytest.approx(correct), ordered)
