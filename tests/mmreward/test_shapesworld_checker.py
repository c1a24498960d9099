"""ShapesEval: detection and GenEval-style checking against rendered ground truth."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import mmreward
from mmreward.synthetic import (
    Scene,
    SceneObject,
    caption,
    detect,
    evaluate_images,
    parse_prompt,
    render,
    sample_scenes,
)
from mmreward.synthetic.checker import check, connected_components, relation_holds, scene_detections, segment
from mmreward.synthetic.prompts import COLORS, SHAPES


@pytest.mark.parametrize("size", [32, 64])
def test_checker_is_at_least_99_percent_strict_on_ground_truth(size):
    scenes = sample_scenes(160 if size == 32 else 64, seed=11, split="all")
    images = render(scenes, size=size)
    result = evaluate_images([caption(s.spec) for s in scenes], images)
    assert result.strict.mean() >= 0.99
    # detections agree with the ground truth objects one to one
    det = detect(images)
    for b, scene in enumerate(scenes[:40]):
        got = sorted((SHAPES[s], COLORS[c]) for s, c in zip(det.shape[det.image == b].tolist(),
                                                              det.color[det.image == b].tolist()))
        assert got == sorted((o.shape, o.color) for o in scene.objects)


def test_ground_truth_scenes_satisfy_their_specs_symbolically():
    scenes = sample_scenes(300, seed=2, split="all")
    result = check([s.spec for s in scenes], scene_detections(scenes))
    assert result.strict.min() == 1


def _geneval_relation(a_box, b_box, threshold=0.1):
    """GenEval's relative_position, re-derived with numpy on (x0, y0, x1, y1) boxes."""
    boxes = np.array([a_box, b_box], dtype=float).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rel = set()
    rel |= {"left of"} if dx < -0.5 else set()
    rel |= {"right of"} if dx > 0.5 else set()
    rel |= {"above"} if dy < -0.5 else set()
    rel |= {"below"} if dy > 0.5 else set()
    return rel


def test_relation_matches_geneval_formula():
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        ca, cb = torch.rand(2, generator=g), torch.rand(2, generator=g)
        sa, sb = 0.05 + 0.3 * torch.rand(2, generator=g), 0.05 + 0.3 * torch.rand(2, generator=g)
        ref = _geneval_relation(torch.cat([ca - sa / 2, ca + sa / 2]).tolist(), torch.cat([cb - sb / 2, cb + sb / 2]).tolist())
        for rel in ("left of", "right of", "above", "below"):
            assert relation_holds(rel, ca, sa, cb, sb) == (rel in ref)


def test_connected_components_match_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(-1, 3, (3, 20, 20), generator=g)
    labels[labels == 2] = -1  # sparse, so components have varied shapes
    comp = connected_components(labels)
    for b in range(3):
        for c in (0, 1):
            ref, n = ndimage.label((labels[b] == c).numpy(), structure=np.ones((3, 3)))
            ours = comp[b][labels[b] == c]
            assert len(torch.unique(ours)) == n
            # same partition: each of our components is exactly one reference component
            pairs = set(zip(ours.tolist(), torch.from_numpy(ref)[labels[b] == c].tolist()))
            assert len(pairs) == n


def test_segmentation_reads_partial_coverage_as_the_same_colour():
    scenes = sample_scenes(20, seed=5, split="all")
    labels, alpha = segment(render(scenes, 32))
    fg = labels >= 0
    assert alpha[fg].min() > 0.5 and alpha[fg].max() <= 1


def test_corrupted_images_fail_the_right_clause():
    spec = parse_prompt("a red circle left of a blue square")
    a = SceneObject("circle", "red", 0.25, 0.3, 0.35)
    b = SceneObject("square", "blue", 0.75, 0.3, 0.35)
    good = Scene((a, b), spec)
    wrong_colour = Scene((dataclasses.replace(a, color="green"), b), spec)
    swapped = Scene((dataclasses.replace(a, x=b.x), dataclasses.replace(b, x=a.x)), spec)
    missing = Scene((b,), spec)
    res = check([spec] * 4, detect(render([good, wrong_colour, swapped, missing], 32)))
    assert res.strict.tolist() == [1, 0, 0, 0]
    assert res.by_kind["color"].tolist() == [1, 0.5, 1, 0.5]
    assert res.by_kind["position"].tolist() == [1, 0, 0, 0]
    assert res.by_kind["object"].tolist() == [1, 1, 1, 0.5]
    assert torch.allclose(res.partial, torch.tensor([1, 3 / 5, 4 / 5, 2 / 5]))


def test_counting_is_exact():
    scenes = sample_scenes(40, seed=3, split="all", categories=("counting",))
    det = detect(render(scenes, 32))
    for delta in (-1, 1):  # one fewer or one more than present: both fail (GenEval's exclude clause)
        wrong = [dataclasses.replace(s.spec, objects=(dataclasses.replace(s.spec.objects[0], count=s.spec.objects[0].count + delta),))
                 for s in scenes]
        assert check(wrong, det).strict.sum() == 0
    assert check([s.spec for s in scenes], det).strict.min() == 1


def test_shapes_eval_reward():
    scenes = sample_scenes(12, seed=9, split="heldout")
    images = render(scenes, 32)
    prompts = [caption(s.spec) for s in scenes]
    reward = mmreward.load("shapes-eval")
    out = reward.score(prompts, images)
    assert out.scores.tolist() == [1.0] * 12
    assert set(out.details) >= {"strict", "partial", "soft", "object", "count", "color", "position"}
    flipped = reward.score(prompts[::-1], images)  # mostly wrong prompts
    assert flipped.scores.mean() < 0.5
    partial = mmreward.load("shapes-eval", mode="partial").score(prompts[::-1], images)
    assert (partial.scores >= flipped.scores).all()
    with pytest.raises(mmreward.RewardInputError, match="a photo of a cat"):
        reward.score(["a photo of a cat"], images[:1])
    nan = mmreward.load("shapes-eval", unknown_prompt="nan").score(["a photo of a cat", prompts[1]], images[:2])
    assert torch.isnan(nan.scores[0]) and nan.scores[1] == 1
    with pytest.raises(mmreward.RewardInputError, match="mode"):
        mmreward.load("shapes-eval", mode="exact")


def test_detector_interface_dicts():
    scenes = sample_scenes(3, seed=1, split="all")
    dicts = detect(render(scenes, 64)).to_dicts()
    assert [len(d) for d in dicts] == [len(s.objects) for s in scenes]
    for d, s in zip(dicts, scenes):
        for item, _o in zip(sorted(d, key=lambda r: r["box"][0] + 1000 * r["box"][1]),
                           sorted(s.objects, key=lambda o: o.x + 1000 * (o.y - o.size / 2))):
            assert set(item) == {"label", "color", "box", "score"}
            assert 0 < item["score"] <= 1
