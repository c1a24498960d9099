"""Losses and advantages against independent computations (closed forms, plain loops, torch.distributions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusion_rl import advantages as A
from diffusion_rl import losses as L
from mmreward.errors import ConfigError


def test_ppo_clip_equals_the_vanilla_policy_gradient_at_ratio_one():
    theta = torch.randn(5, requires_grad=True)
    feats = torch.randn(6, 5)
    adv = torch.randn(6)
    log_prob = feats @ theta
    out = L.ppo_clip_loss(log_prob, log_prob.detach(), adv, clip_range=1e-4)
    (g_ppo,) = torch.autograd.grad(out.loss, theta)
    g_pg = -(adv[:, None] * feats).mean(0)  # grad of -mean(A log pi) for log pi = feats @ theta
    torch.testing.assert_close(out.loss, -adv.mean())
    torch.testing.assert_close(g_ppo, g_pg)
    assert out.clip_fraction == 0


def test_ppo_clip_stops_gradient_outside_the_trust_region():
    lp = torch.tensor([0.5, -0.5, 0.5, -0.5], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    out = L.ppo_clip_loss(lp, torch.zeros(4), adv, clip_range=0.2)
    out.loss.backward()
    # ratio e^0.5 with A>0 and e^-0.5 with A<0 are clipped (no gradient); the other two are not
    r = torch.exp(torch.tensor([0.5, -0.5, 0.5, -0.5]))
    expected = torch.tensor([0.0, 0.0, -adv[2] * r[2], -adv[3] * r[3]]) / 4
    torch.testing.assert_close(lp.grad, expected)
    assert float(out.clip_fraction) == 1.0


def test_gaussian_kl_exact_and_flow_grpo_forms():
    m1, m2 = torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    std = torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64).view(3, 1, 1, 1)
    kl_sum = L.gaussian_kl(m1, m2, std, reduction="sum")
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(m1, std.expand_as(m1)),
                                            torch.distributions.Normal(m2, std.expand_as(m2))).flatten(1).sum(1)
    torch.testing.assert_close(kl_sum, ref)
    dt = torch.tensor([-0.1, -0.2, -0.05], dtype=torch.float64)
    torch.testing.assert_close(L.gaussian_kl(m1, m2, std, mode="flow_grpo", dt=dt),
                               L.gaussian_kl(m1, m2, std) * dt.abs())
    with pytest.raises(ConfigError, match="needs dt"):
        L.gaussian_kl(m1, m2, std, mode="flow_grpo")


def test_normalized_log_ratio_is_zero_on_policy_and_removes_mean_shift():
    mean = torch.randn(2, 3, 4)
    lp = torch.randn(2)
    assert torch.equal(L.normalized_log_ratio(lp, lp, mean, mean, torch.tensor(0.5)), torch.zeros(2))
    # For x drawn from the old policy, E[log r] = -|dmu|^2/(2 s^2) per element; the bias term adds it back.
    s, shift = 0.5, 0.1
    x = torch.randn(4000, 8) * s
    new_lp = -((x - shift) ** 2).mean(1) / (2 * s**2)
    old_lp = -(x**2).mean(1) / (2 * s**2)
    nr = L.normalized_log_ratio(new_lp, old_lp, torch.full((4000, 8), shift), torch.zeros(4000, 8), torch.tensor(s))
    assert abs(float(nr.mean())) < 3 * float(nr.std()) / 4000**0.5 + 1e-3


def _loop_group_adv(r, groups, scope, ddof, eps):
    out = np.zeros_like(r)
    for g in np.unique(groups):
        m = groups == g
        std = r.std(ddof=ddof) if scope == "global" else r[m].std(ddof=ddof)
        out[m] = (r[m] - r[m].mean()) / (std + eps)
    return out


@pytest.mark.parametrize("scope", ["group", "global"])
@pytest.mark.parametrize("unbiased", [False, True])
def test_group_advantages_match_a_plain_loop(scope, unbiased):
    r = np.random.default_rng(0).normal(size=12)
    groups = np.repeat([3, 1, 7], 4)
    got = A.group_advantages(torch.tensor(r), torch.tensor(groups), std_scope=scope, unbiased=unbiased, eps=1e-4)
    np.testing.assert_allclose(got.numpy(), _loop_group_adv(r, groups, scope, int(unbiased), 1e-4), rtol=1e-5, atol=1e-6)


def test_zero_variance_group_gets_zero_advantage():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = A.group_advantages(r, g, eps=0.0 + 1e-8)
    assert torch.equal(adv[:3], torch.zeros(3)) and torch.isfinite(adv).all()
    assert A.zero_variance_fraction(r, g) == 0.5


def test_within_group_fraction_is_the_anova_share_and_spans_zero_to_one():
    rng = np.random.default_rng(3)
    r = rng.normal(size=12)
    g = np.repeat([2, 0, 1], 4)  # group labels need not be sorted or start at 0
    within = sum(((r[g == k] - r[g == k].mean()) ** 2).sum() for k in (0, 1, 2))
    total = ((r - r.mean()) ** 2).sum()
    got = A.within_group_fraction(torch.tensor(r), torch.tensor(g))
    assert got == pytest.approx(within / total, rel=1e-9)
    # groups that differ only in their means: all between; identical group means: all within
    assert A.within_group_fraction(torch.tensor([1.0, 1.0, 3.0, 3.0]), torch.tensor([0, 0, 1, 1])) == 0.0
    assert A.within_group_fraction(torch.tensor([0.0, 2.0, 2.0, 0.0]), torch.tensor([0, 0, 1, 1])) == 1.0
    assert np.isnan(A.within_group_fraction(torch.ones(4), torch.tensor([0, 0, 1, 1])))


def test_per_prompt_tracker_matches_ddpo_rule():
    tr = A.PerPromptStatTracker(buffer_size=4, min_count=3, eps=1e-6)
    first = tr.update(["a", "a", "b"], torch.tensor([1.0, 2.0, 5.0]))
    batch = np.array([1.0, 2.0, 5.0])  # too few rewards per prompt: batch statistics
    np.testing.assert_allclose(first.numpy(), (batch - batch.mean()) / (batch.std() + 1e-6), rtol=1e-6)
    second = tr.update(["a", "a"], torch.tensor([3.0, 4.0]))
    buf = np.array([1.0, 2.0, 3.0, 4.0])  # prompt 'a' now has 4 >= 3 rewards: its own buffer
    np.testing.assert_allclose(second.numpy(), (np.array([3.0, 4.0]) - buf.mean()) / (buf.std() + 1e-6), rtol=1e-6)
    state = tr.state_dict()
    tr2 = A.PerPromptStatTracker()
    tr2.load_state_dict(state)
    torch.testing.assert_close(tr2.update(["a"], torch.tensor([9.0])), tr.update(["a"], torch.tensor([9.0])))


def test_aggregate_reward_vs_advantage_level():
    r = {"x": torch.tensor([1.0, 2.0, 3.0, 4.0]), "y": torch.tensor([10.0, 0.0, 10.0, 0.0])}
    w = {"x": 1.0, "y": 0.5}

    def norm(v):
        return (v - v.mean()) / v.std()

    total, adv_r = A.aggregate(r, w, norm, level="reward")
    torch.testing.assert_close(total, r["x"] + 0.5 * r["y"])
    torch.testing.assert_close(adv_r, norm(r["x"] + 0.5 * r["y"]))
    _, adv_a = A.aggregate(r, w, norm, level="advantage")
    torch.testing.assert_close(adv_a, norm(r["x"]) + 0.5 * norm(r["y"]))
    with pytest.raises(ConfigError, match="not computed"):
        A.aggregate(r, {"z": 1.0}, norm)


def test_pref_grpo_win_rates_match_pairwise_counting():
    import mmreward

    reward = mmreward.load("mock")
    g = torch.Generator().manual_seed(0)
    images = torch.rand(8, 3, 8, 8, generator=g)
    prompts = ["a red square"] * 4 + ["a blue circle"] * 4
    out = A.pref_grpo_rewards(reward, prompts, images, group_size=4)
    scores = reward.score(prompts, images).scores
    expected = []
    for grp in range(2):
        s = scores[grp * 4 : grp * 4 + 4]
        expected += [float((s[i] > s).sum()) / 3 for i in range(4)]
    torch.testing.assert_close(out.win_rates, torch.tensor(expected))
    assert out.agreement == 1.0


def test_exploration_watch_warns_once_after_a_window_of_low_within_group_variance():
    import warnings

    from diffusion_rl.algorithms.grpo import ExplorationWatch

    watch = ExplorationWatch(threshold=0.05, window=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for f in (0.01, 0.02, 0.30, 0.01, 0.02):  # the 0.30 breaks the first run of low values
            watch.update(f)
        assert not caught
        watch.update(float("nan"))  # an all-equal batch says nothing either way
        watch.update(0.03)
        assert len(caught) == 1 and "within_group_fraction" in str(caught[0].message)
        for f in (0.0, 0.0, 0.0):
            watch.update(f)
        assert len(caught) == 1


def test_trailing_mean_of_the_reward_curve_matches_a_cumulative_sum_and_skips_nan():
    from diffusion_rl.reporting import trailing_mean

    rng = np.random.default_rng(0)
    ys = rng.normal(size=30)
    c = np.concatenate([[0.0], np.cumsum(ys)])
    expected = [(c[i + 1] - c[max(0, i - 4)]) / (i + 1 - max(0, i - 4)) for i in range(30)]
    np.testing.assert_allclose(trailing_mean(ys.tolist(), 5), expected, rtol=1e-12)
    assert trailing_mean([1.0, float("nan"), 3.0], 2) == [1.0, 1.0, 3.0]
    assert np.isnan(trailing_mean([float("nan")], 3)[0])

