"""Pure tensor math shared by rewards and algorithms (no models, no I/O)."""

from mmreward.functional.aggregation import (
    bradley_terry_prob,
    coefficient_of_variation,
    log_tame,
)
from mmreward.functional.normalization import RunningMoments, affine, zscore
from mmreward.functional.pairwise import (
    agreement_rate,
    debias,
    group_pairs,
    group_win_rates_from_probs,
    pair_outcomes,
    win_rates,
)

__all__ = [
    "RunningMoments",
    "affine",
    "agreement_rate",
    "bradley_terry_prob",
    "coefficient_of_variation",
    "debias",
    "group_pairs",
    "group_win_rates_from_probs",
    "log_tame",
    "pair_outcomes",
    "win_rates",
    "zscore",
]
