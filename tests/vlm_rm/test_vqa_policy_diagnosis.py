"""benchmarks/vqa_policy_diagnosis.py: its per-kind numbers on hand-built answer distributions equal a hand
computation, the image shuffle stays within a kind, and the linear probe separates separable data only."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from benchmarks.vqa_policy_diagnosis import _linear_probe, per_kind
from mmreward.synthetic.vqa_policy import shuffled_within_kind


def test_per_kind_matches_a_hand_computation():
    # vocabulary of 3 tokens; items 0, 1 are kind "a" (answer token 0), item 2 is kind "b" (answer token 2)
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.25, 0.25, 0.5]])
    items = [SimpleNamespace(kind="a"), SimpleNamespace(kind="a"), SimpleNamespace(kind="b")]
    answers = torch.tensor([0, 0, 2])
    out = per_kind(items, probs.log(), answers, temperature=1.0, group=4, decode=str)
    assert out["a"]["greedy"] == pytest.approx(0.5) and out["b"]["greedy"] == pytest.approx(1.0)
    assert out["a"]["sampled"] == pytest.approx((0.6 + 0.2) / 2, abs=1e-3)
    var = [1 - p ** 4 - (1 - p) ** 4 for p in (0.6, 0.2)]
    assert out["a"]["group_has_variance"] == pytest.approx(sum(var) / 2, abs=1e-3)
    assert out["a"]["answer_nll"] == pytest.approx(-(math.log(0.6) + math.log(0.2)) / 2, abs=1e-3)
    assert out["a"]["greedy_answers"] == {"0": 1, "1": 1}
    # temperature 2: p_T = p^(1/2) / sum p^(1/2), computed by hand for item 2
    hot = per_kind(items, probs.log(), answers, temperature=2.0, group=4, decode=str)
    root = [math.sqrt(p) for p in (0.25, 0.25, 0.5)]
    assert hot["b"]["sampled"] == pytest.approx(root[2] / sum(root), abs=1e-3)


def test_shuffle_keeps_each_kind_and_is_a_permutation():
    items = [SimpleNamespace(kind=k) for k in "aabbbab"]
    images = [f"{it.kind}{i}" for i, it in enumerate(items)]
    out = shuffled_within_kind(items, images, seed=3)
    assert sorted(out) == sorted(images)
    assert all(o[0] == it.kind for o, it in zip(out, items))
    assert out != images


def test_linear_probe_separates_only_separable_data():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (400,), generator=g)
    x = torch.randn(400, 20, generator=g)
    x[:, :4] += 4 * torch.nn.functional.one_hot(y, 4)  # the label is written into four coordinates
    assert _linear_probe(x, y, 300) >= 0.95
    assert _linear_probe(torch.randn(400, 20, generator=g), y, 300) <= 0.45  # chance is 0.25
