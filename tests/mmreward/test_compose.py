"""Composition: weighted sums, normalisers, log-tamed aggregation and group win rates vs independent math."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmreward
from mmreward.compose import Normalizer, WeightedSum, group_win_rates
from mmreward.errors import ConfigError, RewardInputError, RewardValueError
from mmreward.functional import RunningMoments, log_tame
from mmreward.types import PairwiseOutput, Reward, RewardOutput


class Channel(Reward):
    """Score = mean of one colour channel (differentiable); optional lower-is-better or NaN."""

    requires_prompt = False
    differentiable = True

    def __init__(self, c, higher=True, nan=False):
        super().__init__()
        self.c, self.nan = c, nan
        self.higher_is_better = higher
        self.may_return_nan = nan

    def _score(self, prompts, media):
        s = media[:, self.c].flatten(1).mean(1)
        return RewardOutput(torch.full_like(s, float("nan")) if self.nan else s)


def test_weighted_sum_orients_normalises_and_weights():
    x = torch.rand(5, 3, 4, 4)
    r, g, b = (x[:, i].flatten(1).mean(1) for i in range(3))
    total = WeightedSum(
        {"r": Channel(0), "g": Channel(1, higher=False), "b": Channel(2)},
        weights={"r": 2.0, "g": 0.5},
        normalization={"b": (10.0, 1.0)},
    )
    out = total.score(None, x)
    torch.testing.assert_close(out.scores, 2 * r + 0.5 * (-g) + (10 * b + 1))
    torch.testing.assert_close(out.details["g"], g)  # details keep raw scores
    assert total.differentiable
    with pytest.raises(ConfigError, match="not composed"):
        WeightedSum({"r": Channel(0)}, weights={"q": 1.0})
    with pytest.raises(ConfigError, match="normalization"):
        WeightedSum({"r": Channel(0)}, normalization={"r": "sometimes"})


def test_running_zscore_equals_statistics_of_everything_seen():
    batches = [torch.randn(4) * 3 + 1, torch.randn(6) * 3 + 1]
    norm = Normalizer("running")
    norm(batches[0])
    out = norm(batches[1])
    seen = torch.cat(batches).double().numpy()
    torch.testing.assert_close(out.double(), (batches[1].double() - seen.mean()) / (seen.std() + 1e-6))
    m = RunningMoments()
    for v in seen:
        m.update(torch.tensor([v]))
    assert m.var == pytest.approx(seen.var(), rel=1e-9)


def test_log_tame_matches_paco_formula():
    rng = np.random.default_rng(0)
    rewards = np.stack([rng.uniform(0.4, 0.6, 8), rng.uniform(0.0, 5.0, 8), rng.uniform(1, 1.2, 8)])
    w = np.array([1.0, 0.5, 2.0])
    h = rewards.std(axis=1) / (rewards.mean(axis=1) + 1e-6)
    for thr, cut in (("mean", h.mean()), ("median", np.median(h)), (0.05, 0.05)):
        tamed = h > cut
        expected = (w[:, None] * np.where(tamed[:, None], np.log1p(rewards), rewards)).sum(0)
        got, mask = log_tame(torch.from_numpy(rewards), torch.from_numpy(w), thr)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
        assert mask.numpy().tolist() == tamed.tolist()


def test_nan_policy():
    x = torch.rand(2, 3, 4, 4)
    with pytest.raises(RewardValueError, match="nan_policy"):
        WeightedSum({"a": Channel(0), "n": Channel(1, nan=True)}).score(None, x)
    out = WeightedSum({"a": Channel(0), "n": Channel(1, nan=True)}, nan_policy="propagate").score(None, x)
    assert torch.isnan(out.scores).all()


class Biased(Reward):
    """A judge that prefers brighter images but adds `bias` to whichever image is shown first."""

    requires_prompt = False

    def __init__(self, bias=0.0, fail_pairs=0):
        super().__init__()
        self.bias, self.fail_pairs = bias, fail_pairs

    def _score(self, prompts, media):
        return RewardOutput(media.flatten(1).mean(1))

    def compare(self, prompts, a, b, value_range=None):
        sa, sb = self.score(prompts, a).scores, self.score(prompts, b).scores
        p = torch.where(sa > sb, 0.9, torch.where(sa < sb, 0.1, 0.5)) + self.bias
        p = p.clamp(0, 1)
        if self.fail_pairs:
            p[: self.fail_pairs] = float("nan")
        return PairwiseOutput(prob_a=p)


def test_group_win_rates_rank_members_within_each_group():
    levels = torch.tensor([0.2, 0.8, 0.5, 0.1, 0.9, 0.3, 0.6, 0.4])
    x = levels.view(8, 1, 1, 1).expand(8, 3, 2, 2).contiguous()
    out = group_win_rates(Biased(), None, x, group_size=4, both_orders=False)
    # win rate = (number of group members darker than me) / (G - 1)
    expected = torch.cat([(g[:, None] > g[None, :]).float().sum(1) / 3 for g in levels.view(2, 4)])
    torch.testing.assert_close(out.win_rates, expected)
    assert out.num_pairs == 12 and out.num_failed == 0


def test_both_orders_cancels_position_bias_and_reports_agreement():
    levels = torch.tensor([0.2, 0.8, 0.5, 0.1])
    x = levels.view(4, 1, 1, 1).expand(4, 3, 2, 2).contiguous()
    one = group_win_rates(Biased(bias=0.45), None, x, group_size=4, both_orders=False)
    assert one.win_rates.tolist() != pytest.approx([1 / 3, 1, 2 / 3, 0])  # first-position bias breaks the ranking
    both = group_win_rates(Biased(bias=0.45), None, x, group_size=4, both_orders=True)
    torch.testing.assert_close(both.win_rates, torch.tensor([1 / 3, 1.0, 2 / 3, 0.0]))
    assert both.agreement == 0.0  # the first-shown image always "wins", so the two orders never agree
    fair = group_win_rates(Biased(bias=0.0), None, x, group_size=4, both_orders=True)
    assert fair.agreement == 1.0
    failed = group_win_rates(Biased(fail_pairs=6), None, x, group_size=4, both_orders=False)
    assert failed.num_failed == 6
    torch.testing.assert_close(failed.win_rates, torch.full((4,), 0.5))  # every failure counts 0.5


def test_group_win_rate_errors():
    x = torch.rand(6, 3, 2, 2)
    with pytest.raises(RewardInputError, match="complete groups of 4"):
        group_win_rates(Biased(), None, x, group_size=4)
    with pytest.raises(RewardInputError, match="at least 2|>= 2"):
        group_win_rates(Biased(), None, x, group_size=1)
    with pytest.raises(RewardInputError, match="mixes prompts"):
        group_win_rates(mmreward.load("mock"), ["a", "a", "b", "a", "c", "c"], x, group_size=3)


class CountingBT(Reward):
    """Brightness score on the base class's Bradley-Terry `compare`; counts the items it scores."""

    requires_prompt = False

    def __init__(self):
        super().__init__()
        self.scored = 0

    def _score(self, prompts, media):
        self.scored += len(media)
        return RewardOutput(media.flatten(1).mean(1))


def test_group_win_rates_score_a_bradley_terry_reward_once_per_item():
    levels = torch.tensor([0.2, 0.8, 0.5, 0.1, 0.9, 0.3, 0.6, 0.4])
    x = levels.view(8, 1, 1, 1).expand(8, 3, 2, 2).contiguous()
    for both in (True, False):
        reward = CountingBT()
        out = group_win_rates(reward, None, x, group_size=4, both_orders=both)
        assert reward.scored == 8  # not 2 images x 12 pairs (x 2 orders): P(j > i) = 1 - P(i > j) exactly
        expected = torch.cat([(g[:, None] > g[None, :]).float().sum(1) / 3 for g in levels.view(2, 4)])
        torch.testing.assert_close(out.win_rates, expected)
        assert out.num_pairs == 12 and out.agreement == (1.0 if both else None)


class TieThenWin(Reward):
    """Calls a pair a tie when the darker image is shown first and the brighter one the winner (0.9) when it
    is shown first: the two orders do not name the same winner."""

    requires_prompt = False

    def _score(self, prompts, media):
        return RewardOutput(media.flatten(1).mean(1))

    def compare(self, prompts, a, b, value_range=None):
        sa, sb = self.score(prompts, a).scores, self.score(prompts, b).scores
        return PairwiseOutput(prob_a=torch.where(sa < sb, 0.5, 0.9))


def test_both_orders_a_tie_agrees_only_with_a_tie():
    levels = torch.tensor([0.1, 0.2, 0.3])
    x = levels.view(3, 1, 1, 1).expand(3, 3, 2, 2).contiguous()
    out = group_win_rates(TieThenWin(), None, x, group_size=3, both_orders=True)
    assert out.agreement == 0.0  # a tie in one order and a win in the other is a disagreement
    # P(darker > brighter) = (0.5 + 1 - 0.9) / 2 = 0.3: the brighter image wins every pair
    torch.testing.assert_close(out.win_rates, torch.tensor([0.0, 0.5, 1.0]))


@pytest.mark.parametrize("names", [("eval", "train"), ("forward", "type"), ("keys", "hpsv2.1"), ("a.b", "")])
def test_any_string_names_a_composed_reward(names):
    """Names collide with nn.Module attributes or hold '.' (issue 28 item 8): every string is a valid name."""
    x = torch.rand(3, 3, 4, 4)
    total = WeightedSum({names[0]: Channel(0), names[1] + "x": Channel(2)}, weights={names[0]: 2.0})
    out = total.score(None, x)
    r, b = x[:, 0].flatten(1).mean(1), x[:, 2].flatten(1).mean(1)
    torch.testing.assert_close(out.scores, 2 * r + b)
    torch.testing.assert_close(out.details[names[0]], r)
    assert list(out.details) == [names[0], names[1] + "x"]
    assert len(list(total.parameters())) == 0 and total.train() is total  # nn.Module methods intact


def test_composed_reward_names_must_be_non_empty_strings():
    with pytest.raises(ConfigError, match="non-empty strings"):
        WeightedSum({"": Channel(0)})
