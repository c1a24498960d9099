"""Exact pairwise and ranking metrics for reward-model benchmarks (pure numpy, no I/O).

Conventions used throughout:
  h: human preference per pair: +1 (first candidate better), -1 (second better), 0 (human tie).
  m: model margin per pair: score(first) - score(second) for higher-is-better rewards.

Zero-margin policy (`zero_margin`): how a pair the model scores exactly equal is counted when the
human preferred one side: "wrong" (0 credit, what VideoAlign's `calc_accuracy_without_ties` and
ImageReward's `acc` do), "half" (0.5 credit) or "drop" (the pair leaves the denominator).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from mmreward.errors import RewardInputError

ZeroMargin = Literal["wrong", "half", "drop"]
ZERO_MARGIN_POLICIES = ("wrong", "half", "drop")


def _check_policy(zero_margin: str) -> None:
    if zero_margin not in ZERO_MARGIN_POLICIES:
        raise RewardInputError(
            f"zero_margin: expected one of {ZERO_MARGIN_POLICIES}, got {zero_margin!r}"
        )


def _require_finite(name: str, what: str, x: np.ndarray) -> None:
    # NaN compares False with everything, so it would silently count as a wrong (or right) pair
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x))[:5].tolist()
        raise RewardInputError(f"{name}: {what} must be finite; non-finite at indices {bad}")


def _as_pairs(h: Sequence[float], m: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    h_arr = np.sign(np.asarray(h, dtype=np.float64))
    m_arr = np.asarray(m, dtype=np.float64)
    if h_arr.shape != m_arr.shape or h_arr.ndim != 1:
        raise RewardInputError(
            f"h and m must be 1-D and of equal length, got shapes {h_arr.shape} and {m_arr.shape}"
        )
    _require_finite("h", "human preferences (+1, -1 or 0 for a tie)", h_arr)
    _require_finite("m", "model margins", m_arr)
    return h_arr, m_arr


def pair_credit(h: Sequence[float], m: Sequence[float], zero_margin: ZeroMargin = "wrong") -> np.ndarray:
    """Credit of each human-decided pair (h != 0) in [0, 1]; NaN marks pairs to drop.

    Human ties are not part of this metric: they come back as NaN too.
    """
    _check_policy(zero_margin)
    h_arr, m_arr = _as_pairs(h, m)
    credit = np.where(h_arr * m_arr > 0, 1.0, 0.0)
    tie_credit = {"wrong": 0.0, "half": 0.5, "drop": np.nan}[zero_margin]
    credit = np.where((m_arr == 0) & (h_arr != 0), tie_credit, credit)
    return np.where(h_arr == 0, np.nan, credit)


def pairwise_accuracy(h: Sequence[float], m: Sequence[float], zero_margin: ZeroMargin = "wrong") -> float:
    """Accuracy over human-decided pairs (human ties excluded), zero margins per `zero_margin`."""
    credit = pair_credit(h, m, zero_margin)
    kept = credit[~np.isnan(credit)]
    return float(kept.mean()) if kept.size else float("nan")


def _tie_scores_by_prefix(h_sorted: np.ndarray, m_sorted: np.ndarray) -> np.ndarray:
    """Correct count when the first k+1 pairs (by |m|) are model ties, for every k.

    A pair counts as correct when it is concordant and not a model tie, or a human tie that the
    model also ties (Deutsch et al.'s acc_eq numerator C + T_hm); the denominator is always N.
    """
    concordant = (h_sorted != 0) & (h_sorted * m_sorted > 0)
    human_tie = h_sorted == 0
    return concordant.sum() - np.cumsum(concordant) + np.cumsum(human_tie)


def tie_calibrated_accuracy(h: Sequence[float], m: Sequence[float]) -> tuple[float, float]:
    """Accuracy with ties (Deutsch et al. 2023, "Ties Matter"), computed exactly.

    The model declares a tie when |m| <= eps (an exactly zero margin is a tie at every eps). The
    result is max over eps of (#concordant non-tied pairs + #pairs both human and model tie) / N,
    and the eps attaining it. Candidate thresholds are "no new ties" (any eps below every nonzero
    |m|, reported as eps = 0.0 as in Deutsch et al.'s `tau_optimization`) and every distinct |m|;
    each threshold ties *every* pair whose |m| equals it (thresholds are grouped by value), so the
    answer does not depend on input order. Ties in the maximum resolve to the smallest eps, so
    `three_way_credit(h, m, eps).mean()` reproduces the accuracy. Returns (accuracy, eps).
    """
    h_arr, m_arr = _as_pairs(h, m)
    if h_arr.size == 0:
        return float("nan"), float("nan")
    a = np.abs(m_arr)
    order = np.argsort(a, kind="stable")
    a_sorted = a[order]
    correct = _tie_scores_by_prefix(h_arr[order], m_arr[order])
    # the last index of each run of equal |m| is the only admissible cut inside that run
    group_end = np.r_[a_sorted[1:] != a_sorted[:-1], True]
    ends = np.flatnonzero(group_end)
    cut_correct, cut_eps = correct[ends], a_sorted[ends]
    if a_sorted[0] > 0:
        # Without zero margins the empty tied set is a threshold of its own; with them, eps = 0
        # (the first group) already is the "no new ties" threshold, since zeros are always ties.
        concordant = (h_arr != 0) & (h_arr * m_arr > 0)
        cut_correct = np.r_[concordant.sum(), cut_correct]
        cut_eps = np.r_[0.0, cut_eps]
    best = int(np.argmax(cut_correct))  # first maximum = smallest eps
    return float(cut_correct[best] / h_arr.size), float(cut_eps[best])


def tie_calibrated_accuracy_sequential(h: Sequence[float], m: Sequence[float]) -> tuple[float, float]:
    """Compatibility mode: the sequential loop published with VideoGen-RewardBench.

    That loop sorts pairs by |m| (stably, so input order breaks ties) and evaluates the accuracy
    after moving each single pair into the tied set, one at a time. It never scores the "no new
    ties" threshold (so it can fall below the exact value), and when margins repeat it also
    scores cuts *inside* a run of equal |m| — thresholds no real eps can produce — which can lift
    it above the exact value and makes it depend on the order of the input. Use it only to reproduce
    published numbers. Returns (accuracy, eps).
    """
    h_arr, m_arr = _as_pairs(h, m)
    if h_arr.size == 0:
        return float("nan"), float("nan")
    a = np.abs(m_arr)
    order = np.argsort(a, kind="stable")
    correct = _tie_scores_by_prefix(h_arr[order], m_arr[order])
    best = int(np.argmax(correct))  # first strict maximum, as the loop keeps it
    return float(correct[best] / h_arr.size), float(a[order][best])


def three_way_credit(h: Sequence[float], m: Sequence[float], eps: float) -> np.ndarray:
    """Per-pair credit (0/1) of the 3-class prediction sign(m) with |m| <= eps read as a tie."""
    h_arr, m_arr = _as_pairs(h, m)
    if np.isnan(eps):
        raise RewardInputError("eps: the tie threshold must be a number (use 0.0 for ties on equal scores only), got NaN")
    pred = np.where(np.abs(m_arr) <= eps, 0.0, np.sign(m_arr))
    return (pred == h_arr).astype(np.float64)


# ----------------------------------------------------------------------------------------------
# Pick-a-Pic: half credit for ties, tie threshold tuned on validation
# ----------------------------------------------------------------------------------------------
PICKAPIC_THRESHOLDS = tuple(round(0.1 * i, 1) for i in range(11))
# Thresholds are decimal (0.1, 0.2, ...) and so are many judges' probabilities (0.45, 0.55), but
# neither is exact in binary: without slack |p1 - p0| = 0.1 would fall on either side of 0.1 by
# the rounding of its operands. A few ulps of [0, 1] absorb that and nothing a model can express.
_PROB_SLACK = 1e-12


def pickapic_credit(label_0: Sequence[float], prob_0: Sequence[float], threshold: float) -> np.ndarray:
    """Per-pair score of the Pick-a-Pic evaluation.

    label_0 is 1 (image 0 preferred), 0 (image 1 preferred) or 0.5 (tie). The model predicts a
    tie when |p1 - p0| <= threshold with p1 = 1 - p0; an exact match earns 1, a tie on either side
    (but not both) earns 0.5, a wrong side earns 0.
    """
    lab = np.asarray(label_0, dtype=np.float64)
    p0 = np.asarray(prob_0, dtype=np.float64)
    if lab.shape != p0.shape:
        raise RewardInputError(f"label_0 and prob_0 must match in shape, got {lab.shape} and {p0.shape}")
    bad = ~np.isin(lab, (0.0, 0.5, 1.0))
    if bad.any():
        raise RewardInputError(
            f"label_0 must be 0, 0.5 or 1; got {lab[bad][:3].tolist()} at {np.flatnonzero(bad)[:3].tolist()}"
        )
    _require_finite("prob_0", "P(image 0 preferred)", p0)
    out = (p0 < 0) | (p0 > 1)
    if out.any():
        raise RewardInputError(
            f"prob_0 must lie in [0, 1] (a probability, e.g. a softmax over the two scores); got "
            f"{p0[out][:3].tolist()} at {np.flatnonzero(out)[:3].tolist()}"
        )
    if not np.isfinite(threshold):
        raise RewardInputError(f"threshold: the tie threshold on |p1 - p0| must be finite, got {threshold}")
    human = np.where(lab == 0.5, 0, np.where(lab == 1.0, 1, -1))
    # |p1 - p0| = |1 - 2 p0|, computed without the extra rounding of (1 - p0) - p0
    gap = np.abs(1.0 - 2.0 * p0)
    pred = np.where(gap <= threshold + _PROB_SLACK, 0, np.where(p0 > 0.5, 1, -1))
    return np.where(human == pred, 1.0, np.where((human == 0) | (pred == 0), 0.5, 0.0))


def tune_pickapic_threshold(
    label_0: Sequence[float], prob_0: Sequence[float], thresholds: Sequence[float] = PICKAPIC_THRESHOLDS
) -> tuple[float, list[float]]:
    """The threshold of `thresholds` with the best validation score (first one on ties), and all scores."""
    if len(label_0) == 0:
        raise RewardInputError("tune_pickapic_threshold: no pairs to tune on; pass the validation split's labels")
    scores = [float(pickapic_credit(label_0, prob_0, t).mean()) for t in thresholds]
    return float(thresholds[int(np.argmax(scores))]), scores


# ----------------------------------------------------------------------------------------------
# Rankings: HPDv2 inversion accuracy and ImageReward pair accuracy
# ----------------------------------------------------------------------------------------------
def _rank_pairs(rank: Sequence[float], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """For all i<j: human sign (+1 when i ranks better, i.e. a lower rank number) and model margin."""
    r = np.asarray(rank, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if r.shape != s.shape or r.ndim != 1:
        raise RewardInputError(f"rank and scores must be 1-D of equal length, got {r.shape} and {s.shape}")
    _require_finite("rank", "human ranks (lower = better)", r)
    _require_finite("scores", "model scores", s)
    i, j = np.triu_indices(r.size, k=1)
    return np.sign(r[j] - r[i]), s[i] - s[j]


def inversion_accuracy(rank: Sequence[float], scores: Sequence[float], zero_margin: ZeroMargin = "wrong") -> float:
    """HPDv2's per-prompt score: 1 - inversions / (n (n - 1) / 2).

    An inversion is a pair the model orders strictly against the human ranking (lower rank =
    better). Human-tied pairs are never inversions and stay in the denominator, as in HPSv2's
    `inversion_score`. A model tie on a human-ordered pair counts per `zero_margin`: as an
    inversion ("wrong"), half an inversion ("half"), or leaves the denominator ("drop").
    """
    _check_policy(zero_margin)
    h, m = _rank_pairs(rank, scores)
    if h.size == 0:
        return float("nan")
    inversions = ((h * m) < 0).astype(np.float64)
    model_tie = (m == 0) & (h != 0)
    total = float(h.size)
    if zero_margin == "wrong":
        inversions = inversions + model_tie
    elif zero_margin == "half":
        inversions = inversions + 0.5 * model_tie
    else:
        total -= float(model_tie.sum())
    return float(1.0 - inversions.sum() / total) if total > 0 else float("nan")


def ranking_pair_counts(
    rank: Sequence[float], scores: Sequence[float], zero_margin: ZeroMargin = "wrong"
) -> tuple[float, float]:
    """ImageReward's counts for one prompt: (correct, total) over pairs with distinct human ranks.

    Human-tied pairs are skipped; a model tie counts per `zero_margin` ("wrong" as ImageReward does).
    """
    credit = pair_credit(*_rank_pairs(rank, scores), zero_margin=zero_margin)
    kept = credit[~np.isnan(credit)]
    return float(kept.sum()), float(kept.size)
