"""The shipped ShapesWorld assets load offline through the public loaders and keep their measured quality.

Each quality is re-measured on a small fresh sample (other seeds than the card's) and compared to the
number in the asset's card with a tolerance for the smaller sample.
"""

from __future__ import annotations

import json

import pytest
import torch

import mmreward
from mmreward.synthetic import caption, sample_specs
from mmreward.synthetic.assets import AESTHETIC_DIR, CLIP_DIR, GENERATOR_DIR, PREF_DIR, ROOT

pytestmark = pytest.mark.skipif(not ROOT.is_dir(), reason="ShapesWorld assets not present")


def test_assets_are_small():
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    # 30 MB: the image generator (11 MB), the edit model (5.7 MB), the video generator (~5 MB) and the small models
    assert total < 30e6, f"ShapesWorld assets take {total / 1e6:.1f} MB"
    for folder in (CLIP_DIR, GENERATOR_DIR, PREF_DIR, AESTHETIC_DIR):
        assert (folder / "README.md").is_file(), f"{folder} has no card"


def test_clip_loads_and_retrieves_held_out_captions():
    from transformers import AutoTokenizer, CLIPModel

    from mmreward.synthetic.build.train_clip import retrieval_accuracy

    model, tok = CLIPModel.from_pretrained(CLIP_DIR), AutoTokenizer.from_pretrained(CLIP_DIR)
    card = json.loads((CLIP_DIR / "training.json").read_text())["retrieval"]
    fresh = retrieval_accuracy(model, tok, n_per_category=24, seed=7)
    for cat in ("colors", "counting", "color_attr"):
        assert fresh[cat]["top1"] > 4 * fresh[cat]["chance"]
        assert fresh[cat]["top1"] >= card[cat]["top1"] - 0.25
    # the registry's CLIPScore loads the same folder
    score = mmreward.load("clipscore", checkpoint=str(CLIP_DIR))
    from mmreward.synthetic import render, sample_scenes

    scenes = sample_scenes(8, seed=3, split="heldout", categories=("colors",))
    prompts = [caption(s.spec) for s in scenes]
    right = score.score(prompts, render(scenes)).scores
    wrong = score.score(prompts[1:] + prompts[:1], render(scenes)).scores
    assert (right > wrong).float().mean() >= 0.75


def test_preference_model_and_aesthetic_head_keep_their_accuracy():
    from mmreward.synthetic.build.train_preference import aesthetic_quality, pairwise_accuracy

    card = json.loads((PREF_DIR / "training.json").read_text())
    pref = mmreward.load("shapesworld-pref")
    assert type(mmreward.load(str(PREF_DIR))) is type(pref)  # the folder's mmreward.json names the reward
    acc = pairwise_accuracy(pref, n=64, seed=99)
    assert acc["accuracy"] >= card["pref"]["accuracy"] - 0.12
    aes = aesthetic_quality(mmreward.load("shapesworld-aesthetic"), n=64, seed=98)
    assert aes["pearson_r"] >= card["aesthetic"]["pearson_r"] - 0.15


def test_generator_loads_and_draws_the_right_shapes():
    from mmreward.synthetic import evaluate_images
    from mmreward.synthetic.build.evaluate_generator import generate, load_generator

    torch.manual_seed(0)
    pipe = load_generator(GENERATOR_DIR)
    card = json.loads((GENERATOR_DIR / "metrics.json").read_text())["20"]["overall"]
    specs = sample_specs(12, seed=5, split="all", categories=("single_object",))
    images = generate(pipe, [caption(s) for s in specs], seed=5)
    assert images.shape == (12, 3, 32, 32)
    shape_right = evaluate_images(specs, images).by_kind["object"].mean().item()
    assert shape_right >= card["shape_single_object"] - 0.3


@pytest.mark.slow
def test_generator_card_numbers_reproduce():
    from mmreward.synthetic.build.evaluate_generator import evaluate, load_generator

    card = json.loads((GENERATOR_DIR / "metrics.json").read_text())["20"]
    fresh = evaluate(load_generator(GENERATOR_DIR), per_category=24, seed=1)
    assert abs(fresh["overall"]["shape_single_object"] - card["overall"]["shape_single_object"]) < 0.15
    assert abs(fresh["overall"]["strict"] - card["overall"]["strict"]) < 0.12
