"""ShapesWorld scenes, captions and the held-out split."""

from __future__ import annotations

import math

import pytest
import torch

from mmreward.errors import RewardInputError
from mmreward.synthetic import (
    CATEGORIES,
    COLORS,
    SHAPES,
    PromptParseError,
    Scene,
    SceneObject,
    all_specs,
    caption,
    is_held_out,
    parse_prompt,
    render,
    sample_scenes,
)
from mmreward.synthetic.prompts import HELD_OUT_PAIRS
from mmreward.synthetic.scenes import BACKGROUND, PALETTE, specs_for_split


def test_world_size_meets_the_brief():
    assert len(SHAPES) >= 4 and len(COLORS) >= 6
    assert set(CATEGORIES) == {"single_object", "two_object", "counting", "colors", "color_attr", "position"}


def test_sampling_is_deterministic_and_seed_dependent():
    a, b = sample_scenes(16, seed=3), sample_scenes(16, seed=3)
    assert a == b
    assert torch.equal(render(a), render(b))
    assert sample_scenes(16, seed=4) != a


def test_objects_stay_inside_the_image_and_apart():
    for scene in sample_scenes(300, seed=0, split="all"):
        assert 1 <= len(scene.objects) <= 4
        for o in scene.objects:
            assert o.size / 2 < o.x < 1 - o.size / 2 and o.size / 2 < o.y < 1 - o.size / 2
        for i, p in enumerate(scene.objects):
            for q in scene.objects[i + 1 :]:  # boxes separated by a gap on at least one axis
                gap = max(abs(p.x - q.x) - (p.size + q.size) / 2, abs(p.y - q.y) - (p.size + q.size) / 2)
                assert gap > 0.04


def test_held_out_split_is_disjoint_and_covers_every_multi_object_category():
    train, held = specs_for_split("train"), specs_for_split("heldout")
    train_text = {caption(s) for specs in train.values() for s in specs}
    held_text = {caption(s) for specs in held.values() for s in specs}
    assert not train_text & held_text
    assert set(held) == set(CATEGORIES) - {"single_object"}
    for scene in sample_scenes(200, seed=1, split="train"):
        assert not is_held_out(scene.spec)
        bound = {(o.color, o.shape) for o in scene.spec.objects if o.color}
        assert not bound & HELD_OUT_PAIRS


@pytest.mark.parametrize("category", CATEGORIES)
def test_caption_parse_round_trip(category):
    for spec in all_specs(category):
        assert parse_prompt(caption(spec)) == spec
        assert parse_prompt(caption(spec, photo=True).capitalize() + ".") == spec


def test_parser_variants_and_errors():
    s = parse_prompt("An image of a red circle to the left of a blue square")
    assert s.relation == "left of" and s.category == "position"
    assert [o.color for o in s.objects] == ["red", "blue"]
    assert parse_prompt("3 crosses").objects[0].count == 3
    assert parse_prompt("two red circles").category == "counting"
    with pytest.raises(PromptParseError, match="cannot read the object phrase 'a cat'"):
        parse_prompt("a photo of a cat")
    with pytest.raises(PromptParseError, match="at most four"):
        parse_prompt("four circles and a square")
    with pytest.raises(RewardInputError, match="split"):
        sample_scenes(2, split="test")


def test_render_matches_analytic_areas_and_colours():
    # one object of each shape, big, centred: mean coverage must match the closed-form area
    size = 0.6
    areas = {"circle": math.pi / 4, "square": 1.0, "triangle": 0.5, "cross": 1 - (1 - 0.36) ** 2}
    scenes = [Scene((SceneObject(s, "red", 0.5, 0.5, size),), parse_prompt(f"a red {s}")) for s in SHAPES]
    img = render(scenes, size=64, supersample=8)
    bg = torch.tensor(BACKGROUND).view(1, 3, 1, 1)
    red = torch.tensor(PALETTE["red"]).view(1, 3, 1, 1)
    coverage = ((img - bg) / (red - bg))[:, 0].mean((1, 2))  # red channel
    expected = torch.tensor([areas[s] * size**2 for s in SHAPES])
    torch.testing.assert_close(coverage, expected, atol=4e-3, rtol=0)
    # anti-aliased: edge pixels take intermediate values; the background is exact
    assert ((coverage > 0) & (coverage < 1)).all()
    assert torch.allclose(img[:, :, 0, 0], bg.view(1, 3).expand(4, 3))
    edge = img[0, 0][(img[0, 0] > bg[0, 0, 0, 0] + 0.05) & (img[0, 0] < red[0, 0, 0, 0] - 0.05)]
    assert edge.numel() > 8


def test_render_validates_input():
    with pytest.raises(RewardInputError, match="empty"):
        render([])
