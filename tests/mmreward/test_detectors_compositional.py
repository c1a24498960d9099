"""Compositional (GenEval) reward: parser, clause rules on canned detections, OWLv2 loader, ShapesWorld agreement."""

from __future__ import annotations

import pytest
import torch

import mmreward
from mmreward.errors import ConfigError, RewardInputError
from mmreward.geneval import Detection
from mmreward.geneval.evaluate import Thresholds, evaluate, relative_position
from mmreward.geneval.prompt_parser import CompositionSpec, ObjectClause, parse_prompt


def test_parser_covers_geneval_templates():
    assert parse_prompt("a photo of a dog") == CompositionSpec("single_object", (ObjectClause("dog"),))
    assert parse_prompt("a photo of a dog and a cat").tag == "two_object"
    assert parse_prompt("a photo of three teddy bears") == CompositionSpec("counting", (ObjectClause("teddy bear", 3),))
    assert parse_prompt("a photo of a red apple").objects == (ObjectClause("apple", 1, "red"),)
    spec = parse_prompt("a photo of a blue bench and a yellow car")
    assert spec.tag == "color_attr" and [o.color for o in spec.objects] == ["blue", "yellow"]
    pos = parse_prompt("a photo of a cat right of a dog")
    assert pos.relation == "right of" and [o.name for o in pos.objects] == ["cat", "dog"]
    assert parse_prompt("two crosses").objects[0] == ObjectClause("cross", 2)
    assert parse_prompt("a photo of zero people").objects[0] == ObjectClause("person", 0)
    with pytest.raises(RewardInputError, match="cannot parse"):
        parse_prompt("dogs everywhere")
    with pytest.raises(RewardInputError, match="at most two"):
        parse_prompt("a cat and a dog and a bird")


def test_relative_position_closed_form():
    a, b = (0, 0, 10, 10), (30, 0, 40, 10)  # a's centre 30 px left of b's, same row
    assert relative_position(a, b) == {"left of"} and relative_position(b, a) == {"right of"}
    assert relative_position((0, 0, 10, 10), (0, 30, 10, 40)) == {"above"}
    # offsets within 0.1 x summed sizes vanish: centres 1 px apart with 20 px of summed width
    assert relative_position((0, 0, 10, 10), (1, 0, 11, 10)) == set()
    # diagonal at 45 degrees: revised components are ~0.7 of the unit offset on both axes
    assert relative_position((0, 0, 2, 2), (100, 100, 102, 102)) == {"left of", "above"}


def det(label, score=0.95, box=(0, 0, 10, 10), color=None):
    return Detection(label, score, box, color)


def test_clause_rules_on_canned_detections():
    th = Thresholds()
    # single object: a detection counts only strictly above 0.3 (GenEval's `>`)
    assert evaluate(parse_prompt("a dog"), [det("dog", 0.2)], thresholds=th).accuracy is False
    assert evaluate(parse_prompt("a dog"), [det("dog", 0.3)], thresholds=th).accuracy is False
    assert evaluate(parse_prompt("a dog"), [det("dog", 0.35)], thresholds=th).accuracy is True
    # empty detection list: everything fails, dense 0
    ev = evaluate(parse_prompt("a dog and a cat"), [], thresholds=th)
    assert (ev.accuracy, ev.strict, ev.score) == (False, False, 0.0) and "expected dog>=1, found 0" in ev.reason()
    ev = evaluate(parse_prompt("a dog and a cat"), [det("dog")], thresholds=th)
    assert ev.accuracy is False and ev.score == 0.5
    # two dogs for "a dog": GenEval's accuracy passes (>=), Flow-GRPO's strict does not (==), dense 1 - 1/1 = 0
    ev = evaluate(parse_prompt("a dog"), [det("dog", 0.9), det("dog", 0.8)], thresholds=th)
    assert (ev.accuracy, ev.strict, ev.score) == (True, False, 0.0)
    # counting: the 0.9 threshold, count + 1 excluded, dense 1 - |n - found| / n (negative past 2n, as the original)
    three = parse_prompt("three apples")
    assert evaluate(three, [det("apple")] * 3, thresholds=th).accuracy is True
    assert evaluate(three, [det("apple", 0.85)] * 3, thresholds=th).accuracy is False
    four = evaluate(three, [det("apple")] * 4, thresholds=th)
    assert four.accuracy is False and four.strict is False and four.score == pytest.approx(1 - 1 / 3)
    assert evaluate(three, [det("apple")] * 2, thresholds=th).score == pytest.approx(2 / 3)
    assert evaluate(three, [det("apple")] * 9, thresholds=th).score == pytest.approx(1 - 6 / 3)
    # counting zero: GenEval's accuracy passes it; Flow-GRPO would divide by zero, ours scores 1 when none is found
    zero = parse_prompt("zero cats")
    assert evaluate(zero, [], thresholds=th).accuracy is True and evaluate(zero, [], thresholds=th).score == 1.0
    assert evaluate(zero, [det("cat")], thresholds=th).accuracy is False
    # colour from the detector, or from the colour function; the `count` most confident objects must have it
    red_apple = parse_prompt("a red apple")
    assert evaluate(red_apple, [det("apple", color="green")], thresholds=th).accuracy is False
    assert evaluate(red_apple, [det("apple", color="red")], thresholds=th).accuracy is True
    assert evaluate(red_apple, [det("apple")], colors=lambda objs, name: ["red"] * len(objs), thresholds=th).strict
    ev = evaluate(red_apple, [det("apple", 0.9, color="green"), det("apple", 0.8, color="red")], thresholds=th)
    assert ev.accuracy is False  # the top apple is green; a red one further down does not count
    with pytest.raises(ConfigError, match="colour classifier"):
        evaluate(red_apple, [det("apple")], thresholds=th)
    # position: every target must stand in the relation; a failed relation scores [1, 0, 1] (the original's append)
    left = parse_prompt("a cat left of a dog")
    cat, dog = det("cat", box=(0, 0, 10, 10)), det("dog", box=(50, 0, 60, 10))
    ev = evaluate(left, [cat, dog], thresholds=th)
    assert ev.accuracy and ev.strict and ev.score == 1.0
    swapped = evaluate(left, [det("cat", box=(50, 0, 60, 10)), det("dog", box=(0, 0, 10, 10))], thresholds=th)
    assert swapped.accuracy is False and swapped.terms == [1.0, 1.0, 0.0, 1.0] and swapped.score == 0.75
    no_target = evaluate(left, [cat], thresholds=th)  # no target to be left of
    assert no_target.accuracy is False and no_target.terms == [0.0, 1.0, 0.0]


class CannedDetector:
    def __init__(self, detections):
        self.detections, self.calls = detections, []

    def detect(self, images, names):
        self.calls.append([list(n) for n in names])
        return self.detections[: len(images)]


def test_reward_with_canned_detector_and_pixel_colours():
    img = torch.zeros(2, 3, 32, 32)
    img[0, 0, :16, :16] = 1.0  # a red square top-left in image 0
    img[1, 2, :16, :16] = 1.0  # a blue one in image 1
    box = (0.0, 0.0, 16.0, 16.0)
    detector = CannedDetector([[det("square", box=box)], [det("square", box=box)]])
    reward = mmreward.load("geneval", detector=detector, colors="hsv")
    out = reward.score(["a photo of a red square", "a red square"], img)
    assert out.scores.tolist() == [1.0, 0.0]  # colour named from the pixels inside the box
    assert detector.calls[-1] == [["square"], ["square"]]
    dense = mmreward.load("geneval", detector=CannedDetector([[], [det("square", box=box)]]), score="dense", colors="hsv")
    out = dense.score(["a square and a circle"] * 2, img)
    assert out.scores.tolist() == [0.0, 0.5] and out.details["strict"].tolist() == [0.0, 0.0]
    assert out.details["accuracy"].tolist() == [0.0, 0.0]
    with pytest.raises(ConfigError, match="detector must"):
        mmreward.load("geneval", detector="yolo")
    with pytest.raises(ConfigError, match="score must"):
        mmreward.load("geneval", detector=detector, score="soft", colors="hsv")
    with pytest.raises(ConfigError, match="'dense' is Flow-GRPO's training reward"):
        mmreward.load("geneval", detector=detector, score="partial", colors="hsv")
    with pytest.raises(ConfigError, match="colors must"):
        mmreward.load("geneval", detector=detector, colors="lab")


def test_owlv2_checkpoint_folder_loads_and_detects(tmp_path, clip_tokenizer_dir):
    from mmreward.geneval.owlv2 import save_tiny_owlv2

    save_tiny_owlv2(tmp_path, clip_tokenizer_dir)
    reward = mmreward.load("geneval", checkpoint=tmp_path, detector_options={"min_score": 0.0}, score="dense",
                           colors="hsv")
    found = reward.detector.detect(torch.rand(2, 3, 48, 64), [["cat", "dog"], ["apple"]])
    assert len(found) == 2 and found[0] and found[1]
    assert {d.label for d in found[0]} <= {"cat", "dog"} and {d.label for d in found[1]} == {"apple"}
    for d in found[0] + found[1]:
        assert 0.0 <= d.score <= 1.0 and len(d.box) == 4
    out = reward.score(["a cat and a dog", "two apples"], torch.rand(2, 3, 48, 64))
    assert out.scores.shape == (2,)


def test_shapesworld_exact_agreement_with_the_checker():
    checker = pytest.importorskip("mmreward.synthetic.checker")
    from mmreward.synthetic.scenes import render, sample_specs, scenes_for_specs

    scenes = scenes_for_specs(sample_specs(48, seed=1), seed=1)
    images = render(scenes, size=64)
    prompts = [s.prompt for s in scenes]
    reward = mmreward.load("geneval", detector="shapesworld")
    assert reward.score(prompts, images).scores.tolist() == [1.0] * len(prompts)  # ground truth: all correct
    shuffled = prompts[1:] + prompts[:1]  # mismatched pairs: mostly wrong, and exactly as the checker says
    ours = reward.score(shuffled, images).scores
    theirs = checker.evaluate_images(shuffled, images).strict
    assert ours.tolist() == theirs.tolist()
    assert ours.mean() < 0.8
