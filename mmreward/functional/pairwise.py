"""Pairwise verdicts: position-bias control over both presentation orders, credits and group win rates.

The one home of this math: `mmreward.compose.group_win_rates` (Pref-GRPO rewards), `VLMJudge.compare`
and `VLMJudge.group_win_rates` all use it.

A pairwise judge asked twice, (a, b) and (b, a), gives v_ab = P(first better | a first) and
v_ba = P(first better | b first). The debiased preference is

    P(a > b) = (v_ab + (1 - v_ba)) / 2,

so a judge that always prefers the first position gets exactly 0.5 on every pair, and
P(a > b) + P(b > a) = 1 holds by construction. The two orders agree when they name the same winner;
a tie agrees only with a tie. A failed verdict is NaN: it stays NaN through `debias` (or, with
`one_order_fallback`, the other order's verdict is used alone), and counts 0.5 as a credit.
"""

from __future__ import annotations

from typing import Literal

import torch

from mmreward.errors import RewardInputError


def debias(
    v_ab: torch.Tensor, v_ba: torch.Tensor, *, one_order_fallback: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(P(a better than b), per-pair agreement in {0, 1}, NaN when an order has no verdict).

    `one_order_fallback=True` keeps a pair whose verdict failed in one order at the other order's verdict
    (uncorrected for position bias) instead of NaN; its agreement stays NaN.
    """
    prob = (v_ab + (1.0 - v_ba)) / 2.0
    if one_order_fallback:
        prob = torch.where(torch.isnan(v_ab), 1.0 - v_ba, torch.where(torch.isnan(v_ba), v_ab, prob))
    winner_ab = torch.sign(v_ab - 0.5)
    winner_ba = -torch.sign(v_ba - 0.5)  # in the swapped order, "first" is b
    agree = (winner_ab == winner_ba).to(prob.dtype)
    agree = torch.where(torch.isnan(v_ab) | torch.isnan(v_ba), torch.full_like(agree, float("nan")), agree)
    return prob, agree


def agreement_rate(agree: torch.Tensor) -> float:
    """Fraction of pairs (with a verdict in both orders) whose two orders agree; NaN if none."""
    ok = ~torch.isnan(agree)
    return float(agree[ok].mean()) if bool(ok.any()) else float("nan")


def pair_outcomes(prob_a: torch.Tensor, mode: Literal["hard", "soft"] = "hard") -> torch.Tensor:
    """Turn P(a better) into the credit a receives: hard wins (1, 0, 0.5 on an exact tie) or the probability.

    NaN (a failed judgement) becomes 0.5 in both modes; callers report how many there were.
    """
    if mode == "soft":
        out = prob_a.clone()
    elif mode == "hard":
        out = torch.where(prob_a > 0.5, 1.0, torch.where(prob_a < 0.5, 0.0, 0.5)).to(prob_a.dtype)
    else:
        raise RewardInputError(f"mode must be 'hard' or 'soft', got {mode!r}")
    return torch.where(torch.isnan(prob_a), torch.full_like(out, 0.5), out)


def win_rates(credit: torch.Tensor) -> torch.Tensor:
    """Mean credit of each candidate against all others.

    `credit[i, j]` is what i earns against j (diagonal ignored), with credit[j, i] = 1 - credit[i, j].
    Returns a (G,) tensor; Pref-GRPO uses it as the reward of each image in a group of G.
    """
    if credit.ndim != 2 or credit.shape[0] != credit.shape[1]:
        raise RewardInputError(f"credit must be a square (G, G) matrix, got shape {tuple(credit.shape)}")
    g = credit.shape[0]
    if g < 2:
        raise RewardInputError(f"win rates need a group of at least 2 candidates, got {g}")
    off_diag = ~torch.eye(g, dtype=torch.bool, device=credit.device)
    return (credit * off_diag).sum(dim=1) / (g - 1)


def group_pairs(group_size: int, num_groups: int = 1) -> tuple[list[int], list[int]]:
    """Indices (a, b), a < b, of every unordered pair inside each consecutive block of `group_size` items."""
    if group_size < 2:
        raise RewardInputError(f"group_size must be >= 2 for win rates, got {group_size}")
    ii, jj = torch.triu_indices(group_size, group_size, offset=1)
    offsets = torch.arange(num_groups).repeat_interleave(len(ii)) * group_size
    return (ii.repeat(num_groups) + offsets).tolist(), (jj.repeat(num_groups) + offsets).tolist()


def group_win_rates_from_probs(
    prob_a: torch.Tensor, group_size: int, mode: Literal["hard", "soft"] = "hard"
) -> torch.Tensor:
    """Win rate of every item against the rest of its group, from P(a > b) over `group_pairs(group_size, k)`."""
    pairs_per_group = group_size * (group_size - 1) // 2
    if prob_a.ndim != 1 or len(prob_a) % pairs_per_group:
        raise RewardInputError(f"prob_a: expected a multiple of {pairs_per_group} pair probabilities "
                               f"(groups of {group_size}), got shape {tuple(prob_a.shape)}")
    num_groups = len(prob_a) // pairs_per_group
    n = num_groups * group_size
    a_idx, b_idx = group_pairs(group_size, num_groups)
    credit_ab = pair_outcomes(prob_a.float().cpu(), mode)
    credit = torch.zeros(n, n)
    credit[a_idx, b_idx] = credit_ab
    credit[b_idx, a_idx] = 1 - credit_ab
    return torch.cat([win_rates(credit[s : s + group_size, s : s + group_size]) for s in range(0, n, group_size)])
