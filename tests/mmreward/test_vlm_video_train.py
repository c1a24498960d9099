"""Image rewards on videos, temporal consistency, and Bradley-Terry preference training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mmreward
from mmreward.models.video import FrameAggregate, aggregate, sample_frame_indices
from mmreward.train.preference import PrefTrainConfig, bt_loss, pairwise_accuracy, train


def test_frame_sampling_and_aggregations_match_manual():
    assert sample_frame_indices(10, 4).tolist() == [0, 3, 6, 9]
    assert sample_frame_indices(3, 8).tolist() == [0, 1, 2]
    g = torch.Generator().manual_seed(0)
    video = torch.rand(2, 10, 3, 8, 8, generator=g)
    mock = mmreward.load("mock")
    for how, k in (("mean", 1), ("min", 1), ("topk", 2)):
        wrapped = FrameAggregate(mock, num_frames=4, aggregation=how, k=k)
        got = wrapped.score("a red circle", video).scores
        per = torch.stack([mock.score("a red circle", video[i, [0, 3, 6, 9]]).scores for i in range(2)])
        ref = {"mean": per.mean(1), "min": per.min(1).values, "topk": per.sort(1, descending=True).values[:, :2].mean(1)}[how]
        torch.testing.assert_close(got, ref)
    lower = torch.tensor([[3.0, 1.0, 2.0]])
    assert aggregate(lower, "min", higher_is_better=False).item() == 3.0  # worst frame of a lower-is-better reward
    with pytest.raises(mmreward.RewardInputError, match="image reward"):
        FrameAggregate(mmreward.load("temporal-consistency", backbone="pixels"))


def test_frame_aggregate_keeps_gradients():
    wrapped = FrameAggregate(mmreward.load("mock"), num_frames=2)
    x = torch.rand(1, 4, 3, 8, 8, requires_grad=True)
    wrapped.score("a red circle", x).scores.sum().backward()
    assert x.grad[0, 0].abs().sum() > 0 and x.grad[0, 1].abs().sum() == 0  # only sampled frames 0 and 3


def test_temporal_consistency_is_mean_adjacent_cosine():
    g = torch.Generator().manual_seed(1)
    video = torch.rand(2, 5, 3, 6, 6, generator=g)
    video[1] = video[1, :1]  # a static video
    reward = mmreward.load("temporal-consistency", backbone="pixels")
    got = reward.score(None, video).scores
    flat = video.flatten(2)
    ref = torch.nn.functional.cosine_similarity(flat[:, 1:], flat[:, :-1], dim=-1).mean(1)
    torch.testing.assert_close(got, ref)
    assert got[1].item() == pytest.approx(1.0)


def test_bt_loss_closed_form_and_accuracy():
    sa, sb, y = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 0.5])
    d = sa - sb
    ref = -(y * torch.log(torch.sigmoid(d)) + (1 - y) * torch.log(torch.sigmoid(-d))).mean()
    torch.testing.assert_close(bt_loss(sa, sb, y), ref)
    assert pairwise_accuracy(sa, sb, y) == 1.0  # the tie is ignored


@pytest.fixture(scope="module")
def red_blue_pairs(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        red, blue = np.zeros((24, 24, 3), np.uint8), np.zeros((24, 24, 3), np.uint8)
        red[..., 0] = 180 + rng.integers(0, 70)
        blue[..., 2] = 180 + rng.integers(0, 70)
        Image.fromarray(red).save(d / f"r{i}.png")
        Image.fromarray(blue).save(d / f"b{i}.png")
        a, b, y = (f"r{i}.png", f"b{i}.png", 1) if i % 2 else (f"b{i}.png", f"r{i}.png", 0)
        rows.append({"prompt": "a red square", "image_a": a, "image_b": b, "label": y})
    rows.append({"prompt": "a red square", "image_a": "r0.png", "image_b": "r1.png", "label": 0.5})
    (d / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return d


def test_train_pref_learns_and_saves_a_loadable_folder(red_blue_pairs, tmp_path):
    from mmreward.cli import main
    from mmreward.models.clip_score import TINY_CLIP_CONFIG

    out = tmp_path / "pref"
    code = main(["train-pref", "--data", str(red_blue_pairs / "pairs.jsonl"), "--out", str(out),
                 "--backbone-weights", "random", "--backbone-option", "config=" + json.dumps(TINY_CLIP_CONFIG),
                 "--backbone-option", "resize_backend=torch", "--head", "linear", "--lr", "0.05",
                 "--epochs", "4", "--batch-size", "8", "--val-fraction", "0.25", "--cpu"])
    assert code == 0
    card = json.loads((out / "mmreward.json").read_text())
    assert card["reward"] == "preference-head" and card["metrics"]["val_accuracy"] >= 0.8
    reward = mmreward.load(str(out))
    s = reward.score("a red square", [str(red_blue_pairs / "r3.png"), str(red_blue_pairs / "b3.png")]).scores
    assert s[0] > s[1]
    with pytest.raises(mmreward.ConfigError, match="head"):
        PrefTrainConfig(data=str(red_blue_pairs / "pairs.jsonl"), out=str(tmp_path), head="svm")


def test_train_pref_rejects_bad_labels(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "x", "image_a": "a", "image_b": "b", "label": 2}) + "\n" * 2)
    with pytest.raises(mmreward.RewardInputError, match="label must be 0, 0.5 or 1"):
        train(PrefTrainConfig(data=str(tmp_path / "bad.jsonl"), out=str(tmp_path / "o")))
