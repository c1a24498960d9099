"""Every registered reward passes the conformance suite, built tiny with random weights."""

from __future__ import annotations

import pytest

import mmreward
from mmreward.edit import SCORED_WITH_SOURCES
from mmreward.testing.conformance import check_conformance


@pytest.mark.parametrize("name", mmreward.list_rewards())
def test_registered_reward_conforms(name):
    spec = mmreward.get_spec(name)
    missing = spec.missing_requirements()
    if missing:
        pytest.skip(f"{name} needs {missing} (extra '{spec.extra}')")
    if name in SCORED_WITH_SOURCES:
        pytest.skip(f"{name} needs each item's source image: conformance with sources in tests/mmreward/test_edit_rewards.py, test_shapes_edit.py")
    reward = mmreward.load(name, weights="random", **spec.tiny_options)
    check_conformance(reward, **STRUCTURED.get(name, dict)())


def _moving_shapes() -> dict:
    """Rendered clips for the exact moving-shapes checker; two prompts name the wrong direction or colour."""
    import random

    from mmreward.synthetic.motion import motion_caption, parse_motion_prompt, realize_clip, render_clips

    texts = ["a red circle moving left", "a blue square moving up at 2 pixels per frame",
             "a green triangle moving right and turning white", "a white cross moving down"]
    clips = [realize_clip(parse_motion_prompt(t), random.Random(i)) for i, t in enumerate(texts)]
    prompts = [motion_caption(c.spec) for c in clips]
    prompts[1] = prompts[1].replace("moving up", "moving down")
    prompts[2] = prompts[2].replace("a green", "a red")
    return {"media": render_clips(clips), "prompts": prompts}


def _shapes_captions() -> dict:
    """Rendered scenes for shapes-vqa (its plain `score` checks each text as a caption); two captions are wrong."""
    import random

    from mmreward.synthetic.captions import parse_prompt
    from mmreward.synthetic.scenes import realize, render

    texts = ["a red circle", "two blue squares", "a green triangle above a yellow cross", "a white cross"]
    scenes = [realize(parse_prompt(t), random.Random(i)) for i, t in enumerate(texts)]
    prompts = list(texts)
    prompts[1], prompts[3] = "three blue squares", "a purple cross"
    return {"media": render(scenes, size=64), "prompts": prompts}


STRUCTURED = {"shapes-video-eval": _moving_shapes, "shapes-vqa": _shapes_captions}
