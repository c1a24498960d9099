"""Composition of rewards: weighted sums with per-reward normalisation, log-tamed aggregation, group win rates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mmreward.errors import ConfigError, RewardInputError, RewardValueError
from mmreward.functional.aggregation import bradley_terry_prob, log_tame
from mmreward.functional.normalization import RunningMoments
from mmreward.functional.pairwise import agreement_rate, debias, group_pairs, group_win_rates_from_probs
from mmreward.types import Prompts, Reward, RewardOutput, normalize_prompts


@dataclass
class Normalizer:
    """How one reward's raw scores are mapped before weighting.

    kind="none": unchanged; "affine": x * scale + shift; "running": z-score with running moments over
    every batch seen so far (including the current one), as used to balance rewards on different scales.
    """

    kind: Literal["none", "affine", "running"] = "none"
    scale: float = 1.0
    shift: float = 0.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.kind not in ("none", "affine", "running"):
            raise ConfigError(f"normalizer kind must be 'none', 'affine' or 'running', got {self.kind!r}")
        self.moments = RunningMoments()

    def __call__(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        if self.kind == "affine":
            return x * self.scale + self.shift
        if self.kind == "running":
            if update:
                self.moments.update(x)
            return (x - self.moments.mean) / (self.moments.std + self.eps)
        return x


def _as_normalizer(value: Any) -> Normalizer:
    if isinstance(value, Normalizer):
        return value
    if value is None or value == "none":
        return Normalizer("none")
    if value == "running":
        return Normalizer("running")
    if isinstance(value, Mapping):
        return Normalizer(**value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return Normalizer("affine", float(value[0]), float(value[1]))
    raise ConfigError(
        f"normalization: expected 'none', 'running', (scale, shift), a dict or a Normalizer, got {value!r}"
    )


class WeightedSum(Reward):
    """sum_i w_i * norm_i(s_i), with lower-is-better rewards negated first so every term points the same way.

    aggregation="log_tame" applies PaCo-GRPO's log(1 + r) to rewards whose coefficient of variation over
    the batch exceeds the threshold before the weighted sum. `details` holds each reward's raw scores.
    """

    name = "weighted-sum"
    may_return_nan = False

    def __init__(
        self,
        rewards: Mapping[str, Reward],
        weights: Mapping[str, float] | None = None,
        normalization: Mapping[str, Any] | None = None,
        aggregation: Literal["sum", "log_tame"] = "sum",
        log_tame_threshold: float | Literal["mean", "median"] = "mean",
        nan_policy: Literal["raise", "propagate"] = "raise",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not rewards:
            raise ConfigError("rewards: need at least one reward to compose")
        weights = dict(weights or {})
        unknown = set(weights) - set(rewards)
        if unknown:
            raise ConfigError(f"weights name rewards that are not composed: {sorted(unknown)}; rewards: {sorted(rewards)}")
        normalization = dict(normalization or {})
        unknown = set(normalization) - set(rewards)
        if unknown:
            raise ConfigError(f"normalization names rewards that are not composed: {sorted(unknown)}")
        if aggregation not in ("sum", "log_tame"):
            raise ConfigError(f"aggregation must be 'sum' or 'log_tame', got {aggregation!r}")
        if nan_policy not in ("raise", "propagate"):
            raise ConfigError(f"nan_policy must be 'raise' or 'propagate', got {nan_policy!r}")
        bad = [k for k in rewards if not isinstance(k, str) or not k]
        if bad:
            raise ConfigError(f"rewards: names must be non-empty strings, got {bad!r}")
        # A ModuleList, not a ModuleDict: any name a user gives a reward ("eval", "train", "hpsv2.1") must
        # work, and ModuleDict keys collide with nn.Module attributes and may not contain ".".
        self.member_names = list(rewards)
        self.members = torch.nn.ModuleList(list(rewards.values()))
        self.weights = {k: float(weights.get(k, 1.0)) for k in rewards}
        self.normalizers = {k: _as_normalizer(normalization.get(k)) for k in rewards}
        self.aggregation = aggregation
        self.log_tame_threshold = log_tame_threshold
        self.nan_policy = nan_policy
        self.may_return_nan = nan_policy == "propagate"
        members = list(rewards.values())
        self.modalities = tuple(m for m in members[0].modalities if all(m in r.modalities for r in members))
        if not self.modalities:
            raise ConfigError("the composed rewards share no modality (e.g. an image-only and a video-only reward)")
        self.differentiable = all(r.differentiable for r in members)
        self.requires_prompt = any(r.requires_prompt for r in members)

    def _score(self, prompts: list[str], media) -> RewardOutput:
        names = self.member_names
        raw, oriented = {}, []
        for name, reward in zip(names, self.members):
            scores = reward.score(prompts, media).scores.float()
            bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
            if bad and self.nan_policy == "raise":
                raise RewardValueError(
                    f"reward '{name}' returned non-finite scores at batch indices {bad[:10]}; "
                    "use nan_policy='propagate' to keep them as NaN in the sum"
                )
            raw[name] = scores
            sign = 1.0 if reward.higher_is_better else -1.0
            oriented.append(self.normalizers[name](sign * scores))
        stacked = torch.stack(oriented)
        w = torch.tensor([self.weights[n] for n in names], dtype=stacked.dtype, device=stacked.device)
        if self.aggregation == "log_tame":
            total, tamed = log_tame(stacked, w, self.log_tame_threshold)
            details = {**raw, "tamed": tamed.float().expand(len(prompts), -1)}
        else:
            total = (w[:, None] * stacked).sum(dim=0)
            details = dict(raw)
        return RewardOutput(total, details)


def compose(
    rewards: Mapping[str, Reward | str],
    weights: Mapping[str, float] | None = None,
    **options: Any,
) -> WeightedSum:
    """Build a WeightedSum; string entries are loaded with `mmreward.load`."""
    from mmreward.registry import load

    built = {k: (load(v) if isinstance(v, str) else v) for k, v in rewards.items()}
    return WeightedSum(built, weights, **options)


# ----------------------------------------------------------------------------------------------
# group win rates from pairwise comparisons (Pref-GRPO)
# ----------------------------------------------------------------------------------------------
@dataclass
class WinRateOutput:
    win_rates: torch.Tensor  # (B,) each item's mean credit against the other members of its group
    num_pairs: int
    num_failed: int  # comparisons whose probability was NaN (counted as 0.5)
    num_ties: int  # comparisons judged exactly 0.5 (hard mode)
    agreement: float | None  # both orders: fraction of pairs whose two verdicts agree


def group_win_rates(
    reward: Reward,
    prompts: Prompts,
    media: Any,
    group_size: int,
    *,
    both_orders: bool = True,
    mode: Literal["hard", "soft"] = "hard",
    value_range: tuple[float, float] | None = None,
) -> WinRateOutput:
    """Win rate of each item against the other G-1 items of its group (consecutive blocks of `group_size`).

    Every unordered pair is judged in one batched `compare` call. With both_orders=True the pair is also
    judged in the swapped order and P(i > j) is debiased (mmreward.functional.pairwise.debias; a pair that
    failed in one order keeps the other order's verdict) -- unless the reward already does that itself
    (`reward.compare_debiased`), in which case each pair is asked once and the reward's own per-pair
    agreement is reported. A reward on the base class's Bradley-Terry `compare` is scored once per item:
    its P(j > i) = 1 - P(i > j) exactly, so neither a second order nor per-pair scoring adds anything.
    Failed judgements (NaN) and exact ties count 0.5 and are reported.
    """
    batch = reward.prepare(media, value_range)
    n = len(batch)
    if group_size < 2:
        raise RewardInputError(f"group_size must be >= 2 for win rates, got {group_size}")
    if n == 0 or n % group_size:
        raise RewardInputError(
            f"media: {n} items do not split into complete groups of {group_size}; groups are never split"
        )
    prompt_list = normalize_prompts(prompts, n, required=reward.requires_prompt)
    num_groups = n // group_size
    a_idx, b_idx = group_pairs(group_size, num_groups)
    for g in range(num_groups):
        group_prompts = set(prompt_list[g * group_size : (g + 1) * group_size])
        if len(group_prompts) != 1:
            raise RewardInputError(f"group {g} mixes prompts {sorted(group_prompts)[:3]}; a group shares one prompt")

    def pick(idx: list[int]):
        return batch[idx] if isinstance(batch, torch.Tensor) else [batch[i] for i in idx]

    pair_prompts = [prompt_list[i] for i in a_idx]
    agreement = None
    if type(reward).compare is Reward.compare:
        scores = reward.score(prompt_list, batch).scores.float().cpu()
        prob = bradley_terry_prob(scores[a_idx], scores[b_idx], reward.compare_temperature, reward.higher_is_better)
        if both_orders:  # what asking the swapped order would measure: the same winner on every valid pair
            agreement = 1.0 if bool((~torch.isnan(prob)).any()) else float("nan")
    elif reward.compare_debiased:
        out = reward.compare(pair_prompts, pick(a_idx), pick(b_idx))
        prob = out.prob_a.float().cpu()
        if out.details and "agreement" in out.details:
            agreement = agreement_rate(out.details["agreement"].float().cpu())
    else:
        prob = reward.compare(pair_prompts, pick(a_idx), pick(b_idx)).prob_a.float().cpu()
        if both_orders:
            p_ba = reward.compare(pair_prompts, pick(b_idx), pick(a_idx)).prob_a.float().cpu()
            prob, agree = debias(prob, p_ba, one_order_fallback=True)
            agreement = agreement_rate(agree)
    return WinRateOutput(
        win_rates=group_win_rates_from_probs(prob, group_size, mode),
        num_pairs=len(a_idx),
        num_failed=int(torch.isnan(prob).sum()),
        num_ties=int((prob == 0.5).sum()) if mode == "hard" else 0,
        agreement=agreement,
    )
