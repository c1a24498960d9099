"""Moving ShapesWorld: the exact clip checker accepts every rendered clip and rejects wrong or reversed ones."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from mmreward.errors import RewardInputError
from mmreward.synthetic.captions import PromptParseError
from mmreward.synthetic.motion import (
    DIRECTIONS,
    MotionClause,
    MotionSpec,
    all_motion_specs,
    check_clips,
    fit_velocity,
    motion_caption,
    motion_matches,
    parse_motion_prompt,
    realize_clip,
    render_clips,
)
from mmreward.synthetic.prompts import COLORS, SHAPES

# one-object grid: every shape x colour x direction; speed and colour change vary with the index
GRID = [
    MotionSpec((MotionClause(s, c, d, 1 + (i % 2), None if i % 3 else COLORS[(COLORS.index(c) + 1) % len(COLORS)]),))
    for i, (s, c, d) in enumerate((s, c, d) for s in SHAPES for c in COLORS for d in DIRECTIONS)
]
TWO = [
    parse_motion_prompt("a red circle moving left at 2 pixels per frame and turning blue and a green square moving right"),
    parse_motion_prompt("a white cross moving up and a purple triangle moving up at 2 pixels per frame"),
    parse_motion_prompt("a yellow triangle moving down and turning red and a blue circle moving up"),
]


def _clips(specs, seed):
    rng = random.Random(seed)
    return [realize_clip(s, rng) for s in specs]


@pytest.fixture(scope="module")
def grid_clips():
    clips = _clips(GRID + TWO, 0) + _clips(GRID + TWO, 1)
    return clips, render_clips(clips)


def test_rendered_clips_have_the_video_layout(grid_clips):
    clips, videos = grid_clips
    assert videos.shape == (len(clips), 8, 3, 32, 32)
    assert videos.min() >= 0 and videos.max() <= 1
    # motion: first and last frames differ for every clip
    assert ((videos[:, 0] - videos[:, -1]).abs().amax(dim=(1, 2, 3)) > 0.5).all()


def test_checker_accepts_every_rendered_clip_of_the_grid(grid_clips):
    clips, videos = grid_clips
    result = check_clips([c.spec for c in clips], videos)
    failed = [motion_caption(clips[i].spec) for i in (result.strict < 1).nonzero().flatten().tolist()]
    assert not failed, failed[:5]
    assert (result.partial == 1).all()


def _swap(spec: MotionSpec, **change) -> MotionSpec:
    return MotionSpec((replace(spec.objects[0], **change), *spec.objects[1:]))


def test_checker_rejects_other_direction_colour_shape_and_count(grid_clips):
    clips, videos = grid_clips
    n = len(GRID)
    videos, clips = videos[:n], clips[:n]
    opposite = {"left": "right", "right": "left", "up": "down", "down": "up"}
    turn = {"left": "up", "right": "down", "up": "right", "down": "left"}
    wrong = {
        "direction": [_swap(c.spec, direction=opposite[c.spec.objects[0].direction]) for c in clips],
        "axis": [_swap(c.spec, direction=turn[c.spec.objects[0].direction]) for c in clips],
        "speed": [_swap(c.spec, speed=3 - c.spec.objects[0].speed) for c in clips],
        "colour": [_swap(c.spec, color=COLORS[(COLORS.index(c.spec.objects[0].color) + 3) % 6]) for c in clips],
        "shape": [_swap(c.spec, shape=SHAPES[(SHAPES.index(c.spec.objects[0].shape) + 1) % 4]) for c in clips],
    }
    for what, specs in wrong.items():
        result = check_clips(specs, videos)
        assert (result.strict == 0).all(), what
    # a second object that is not there fails the count clause in every clip
    extra = [MotionSpec((c.spec.objects[0], MotionClause(
        SHAPES[(SHAPES.index(c.spec.objects[0].shape) + 1) % 4], "white",
        c.spec.objects[0].direction))) for c in clips]
    result = check_clips(extra, videos)
    assert (result.strict == 0).all() and (result.by_kind["count"] == 0).all()


def test_checker_rejects_a_colour_change_that_did_not_happen_or_clips_for_two_objects(grid_clips):
    clips, videos = grid_clips
    steady = [i for i, c in enumerate(clips[: len(GRID)]) if c.spec.objects[0].end_color is None]
    specs = [_swap(clips[i].spec, end_color=COLORS[(COLORS.index(clips[i].spec.objects[0].color) + 2) % 6])
             for i in steady]
    result = check_clips(specs, videos[steady])
    assert (result.strict == 0).all() and (result.by_kind["color"] == 0).all()
    # a two-object clip checked against only its first object has one object too many
    two = [i for i, c in enumerate(clips) if c.spec.num_objects == 2]
    result = check_clips([MotionSpec(clips[i].spec.objects[:1]) for i in two], videos[two])
    assert (result.strict == 0).all() and (result.by_kind["count"] == 0).all()


def test_checker_rejects_reverse_time_clips(grid_clips):
    clips, videos = grid_clips
    result = check_clips([c.spec for c in clips], videos.flip(1))
    assert (result.strict == 0).all()
    assert (result.by_kind["motion"] == 0).all()


def test_direction_from_a_hand_computed_centroid_track():
    # centres (x, y) in pixels moving left by 2 px/frame with a 0.5 px wobble in y: slope by hand is
    # vx = sum((t - 1.5)(x - mean x)) / sum((t - 1.5)^2) = (-1.5*3 - 0.5*1 + 0.5*-1 + 1.5*-3) / 5 = -2
    # vy = (-1.5*-0.25 - 0.5*0.25 + 0.5*-0.25 + 1.5*0.25) / 5 = 0.1
    track = torch.tensor([[20.0, 10.0], [18.0, 10.5], [16.0, 10.0], [14.0, 10.5]])
    v = fit_velocity(track)
    assert torch.allclose(v, torch.tensor([-2.0, 0.1], dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert motion_matches(v, "left", 2)
    assert not motion_matches(v, "right", 2) and not motion_matches(v, "left", 1) and not motion_matches(v, "up", 2)


def test_parser_reads_captions_and_variants_and_rejects_the_rest():
    for spec in all_motion_specs()[::37] + TWO:
        assert parse_motion_prompt(motion_caption(spec)) == spec
    spec = parse_motion_prompt("A video of a red plus moving to the left, turning blue.")
    assert spec == MotionSpec((MotionClause("cross", "red", "left", 1, "blue"),))
    for bad, why in [
        ("a red circle", "moving"), ("a red circle moving sideways", "moving"),
        ("a red circle moving left at 5 pixels per frame", "speed"),
        ("a red circle moving left and turning red", "other than"),
        ("a red circle moving left and a blue circle moving right", "different shapes"),
        ("a red circle moving left and a blue square moving up", "same axis"),
    ]:
        with pytest.raises(PromptParseError, match=why):
            parse_motion_prompt(bad)


def test_clip_geometry_and_input_errors_are_typed():
    spec = GRID[0]
    with pytest.raises(RewardInputError, match="too long or too fast"):
        realize_clip(_swap(spec, speed=2), random.Random(0), num_frames=16)
    with pytest.raises(RewardInputError, match="num_frames"):
        realize_clip(spec, random.Random(0), num_frames=1)
    with pytest.raises(RewardInputError, match=r"\(B, T, 3, H, W\)"):
        check_clips([spec], torch.zeros(1, 3, 32, 32))
    with pytest.raises(RewardInputError, match="same length"):
        check_clips([spec, spec], torch.zeros(1, 8, 3, 32, 32))


def test_shapes_video_eval_reward_scores_strict_and_partial():
    import mmreward

    clips = _clips(TWO, 3)
    videos = render_clips(clips)
    prompts = [motion_caption(c.spec) for c in clips]
    strict = mmreward.load("shapes-video-eval")
    assert strict.modalities == ("video",)
    assert strict.score(prompts, videos).scores.tolist() == [1.0, 1.0, 1.0]
    # the first prompt asked for the opposite direction of its first object: 1 of 7 clauses fails
    wrong = prompts[0].replace("moving left", "moving right", 1)
    out = mmreward.load("shapes-video-eval", mode="partial").score([wrong], videos[:1])
    assert out.scores.tolist() == pytest.approx([6 / 7])
    assert out.details["strict"].tolist() == [0.0] and out.details["motion"].tolist() == [0.5]
    with pytest.raises(PromptParseError):
        strict.score(["a cat"], videos[:1])
    nan = mmreward.load("shapes-video-eval", unknown_prompt="nan").score(["a cat"], videos[:1])
    assert torch.isnan(nan.scores).all()


def test_one_object_motion_is_judged_apart_from_the_shape(grid_clips):
    # a clip checked against another shape fails `object` but its motion is still the stated one; the same clip
    # checked against the opposite direction fails `motion` too
    clips, videos = grid_clips
    one = [i for i, c in enumerate(clips[: len(GRID)]) if c.spec.num_objects == 1]
    other_shape = [_swap(clips[i].spec, shape=SHAPES[(SHAPES.index(clips[i].spec.objects[0].shape) + 1) % 4])
                   for i in one]
    result = check_clips(other_shape, videos[one])
    assert (result.by_kind["object"] == 0).all() and (result.by_kind["motion"] == 1).all()
    opposite = {"left": "right", "right": "left", "up": "down", "down": "up"}
    backwards = [_swap(s, direction=opposite[s.objects[0].direction]) for s in other_shape]
    assert (check_clips(backwards, videos[one]).by_kind["motion"] == 0).all()


def test_soft_score_grades_motion_by_the_velocity_error(grid_clips):
    # steady one-object clips: object, colour and count hold when every frame is the first one (a still object),
    # and the motion term is exp(-(error / 1 px)^2) with error = the stated speed: (3 + exp(-speed^2)) / 4
    clips, videos = grid_clips
    steady = [i for i, c in enumerate(clips[: len(GRID)]) if c.spec.objects[0].end_color is None][:12]
    specs = [clips[i].spec for i in steady]
    still = videos[steady][:, :1].expand(-1, 8, -1, -1, -1)
    result = check_clips(specs, still)
    speeds = torch.tensor([float(s.objects[0].speed) for s in specs])
    assert result.partial.tolist() == [0.75] * len(steady)
    torch.testing.assert_close(result.soft, (3 + torch.exp(-speeds**2)) / 4, rtol=1e-6, atol=1e-6)
    # the rendered clips move exactly as stated (soft 1); reversed in time, the error is twice the speed
    exact = check_clips(specs, videos[steady])
    torch.testing.assert_close(exact.soft, torch.ones(len(steady)), rtol=0, atol=1e-6)
    rev = check_clips(specs, videos[steady].flip(1))
    torch.testing.assert_close(rev.soft, (3 + torch.exp(-(2 * speeds) ** 2)) / 4, rtol=1e-6, atol=1e-6)


def test_shapes_video_eval_soft_mode_is_the_checkers_soft_score(grid_clips):
    import mmreward

    clips, videos = grid_clips
    prompts = [motion_caption(c.spec) for c in clips[:4]]
    out = mmreward.load("shapes-video-eval", mode="soft").score(prompts, videos[:4].flip(1))
    torch.testing.assert_close(out.scores, check_clips([c.spec for c in clips[:4]], videos[:4].flip(1)).soft.float())
    assert (out.scores < 1).all() and (out.scores > 0).all()


@pytest.mark.parametrize("frames", [4, 8])
def test_centred_clips_are_a_function_of_the_spec_and_pass_the_checker(frames):
    # every one-object spec: the same clip whatever the seed, centred on the image midway through the clip,
    # and the checker accepts all of them
    specs = all_motion_specs()[::5]
    a = [realize_clip(s, random.Random(1), frames, centred=True) for s in specs]
    b = [realize_clip(s, random.Random(2), frames, centred=True) for s in specs]
    assert [c.start for c in a] == [c.start for c in b]
    for clip in a:
        (o,), (clause,) = clip.start, clip.spec.objects
        dx, dy = DIRECTIONS[clause.direction]
        mid = clause.speed * (frames - 1) / 2 / 32
        assert (o.x + dx * mid, o.y + dy * mid) == pytest.approx((0.5, 0.5), abs=0.5 / 32)
    assert (check_clips(specs, render_clips(a)).strict == 1).all()
    with pytest.raises(RewardInputError, match="one object"):
        realize_clip(TWO[0], random.Random(0), frames, centred=True)


def test_motion_mode_scores_the_motion_clause_alone_by_closeness(grid_clips):
    # exp(-(error / 1 px)^2) of the motion clause only: a still object errs by its speed, a time-reversed one by
    # twice its speed, the clip as rendered by 0 (closed forms, independent of the other clauses)
    import mmreward

    clips, videos = grid_clips
    steady = [i for i, c in enumerate(clips[: len(GRID)]) if c.spec.objects[0].end_color is None][:8]
    prompts = [motion_caption(clips[i].spec) for i in steady]
    speeds = torch.tensor([float(clips[i].spec.objects[0].speed) for i in steady])
    reward = mmreward.load("shapes-video-eval", mode="motion")
    still = videos[steady][:, :1].expand(-1, 8, -1, -1, -1)
    torch.testing.assert_close(reward.score(prompts, still).scores, torch.exp(-speeds**2), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(reward.score(prompts, videos[steady].flip(1)).scores, torch.exp(-(2 * speeds) ** 2),
                               rtol=1e-6, atol=1e-6)
    out = reward.score(prompts, videos[steady])
    torch.testing.assert_close(out.scores, torch.ones(len(steady)), rtol=0, atol=1e-6)
    assert "motion_soft" in out.details and out.details["partial"].tolist() == [1.0] * len(steady)
    with pytest.raises(RewardInputError, match="motion"):
        mmreward.load("shapes-eval", mode="motion")  # the image checker has no motion clause
