"""The ShapesWorld checkers on batches with no objects (issue 28 item 17): 0 on every clause, never a ValueError.

A uniform grey image is what an untrained or collapsed generator makes; these rewards are the training rewards
of our own configs, so a batch of them must score (0, with the reason), not stop the run.
"""

from __future__ import annotations

import torch

import mmreward
from mmreward.synthetic.captions import parse_prompt
from mmreward.synthetic.scenes import render, scenes_for_specs


def test_shapes_eval_scores_zero_on_uniform_images_and_says_why():
    reward = mmreward.load("shapes-eval", mode="partial")
    grey = torch.full((2, 3, 64, 64), 0.5)
    out = reward.score(["a red circle", "two blue squares"], grey)
    assert out.scores.tolist() == [0.0, 0.0]
    assert out.details["strict"].tolist() == [0.0, 0.0]
    assert out.details["objects_found"].tolist() == [0.0, 0.0]
    assert out.rationales == ["no objects detected"] * 2


def test_shapes_eval_mixed_batch_keeps_the_real_image_score():
    """One grey image beside a real scene: the scene still scores 1 (the empty one does not poison the batch)."""
    prompt = "a red circle"
    img = render(scenes_for_specs([parse_prompt(prompt)], seed=0), 64)
    reward = mmreward.load("shapes-eval")
    out = reward.score([prompt, prompt], torch.cat([img, torch.full_like(img, 0.5)]))
    assert out.scores.tolist() == [1.0, 0.0]
    assert out.details["objects_found"][0] >= 1 and out.details["objects_found"][1] == 0


def test_shapes_video_eval_scores_zero_on_a_uniform_clip():
    reward = mmreward.load("shapes-video-eval", mode="partial")
    out = reward.score(["a red circle moving left at 1 pixel per frame"], torch.full((1, 4, 3, 32, 32), 0.5))
    assert out.scores.tolist() == [0.0]
    assert out.details["object"].tolist() == [0.0]


def test_shapes_edit_eval_scores_zero_on_uniform_source_and_edit():
    reward = mmreward.load("shapes-edit-eval", mode="gated")
    grey = torch.full((1, 3, 32, 32), 0.5)
    out = reward.score(["make the red circle blue"], grey, metadata=[{"source_image": grey[0]}])
    assert out.scores.tolist() == [0.0]  # the requested edit is absent: gated credit 0
    assert out.details["strict"].tolist() == [0.0] and out.details["edit"].tolist() == [0.0]
