"""Grounding DINO detector for the GenEval reward: a tiny random checkpoint in the official layout (BERT tokenizer),
detections against the processor's own post-processing run image by image in the test."""

from __future__ import annotations

import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError, ConfigError, RewardInputError
from mmreward.geneval.grounding_dino import caption_and_spans, save_tiny_grounding_dino
from tests._helpers.tolerances import assert_close_scaled


@pytest.fixture(scope="module")
def gdino_dir(tmp_path_factory):
    return save_tiny_grounding_dino(tmp_path_factory.mktemp("gdino"))


def images(n, h=48, w=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(n, 3, h, w, generator=g) * 255).round() / 255).unbind(0)


def reference_detections(folder, image, names, box_threshold, text_threshold):
    """One image at a time through the processor and model; each kept query is named by the name whose
    tokens (located in input_ids) hold the highest probability above text_threshold."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    model = AutoModelForZeroShotObjectDetection.from_pretrained(str(folder)).eval()
    processor = AutoProcessor.from_pretrained(str(folder))
    uint8 = (image * 255).round().to(torch.uint8)
    inputs = processor(images=uint8, text=[list(names)], return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs)
    res = processor.post_process_grounded_object_detection(
        outputs, inputs["input_ids"], threshold=box_threshold, text_threshold=text_threshold,
        target_sizes=[tuple(image.shape[-2:])],
    )[0]  # fmt: skip
    ids = inputs["input_ids"][0].tolist()
    positions = {}
    for name in names:
        sub = processor.tokenizer(name, add_special_tokens=False)["input_ids"]
        start = next(i for i in range(len(ids)) if ids[i : i + len(sub)] == sub)
        positions[name] = list(range(start, start + len(sub)))
    probs = outputs.logits[0].sigmoid()
    kept = probs[probs.max(-1).values > box_threshold]
    found = []
    for box, score, p in zip(res["boxes"], res["scores"], kept):
        best = {n: max(float(p[i]) for i in pos) for n, pos in positions.items()}
        best = {n: v for n, v in best.items() if v > text_threshold}
        if best:
            found.append((max(best, key=best.get), float(score), box.tolist()))
    return found


def test_detections_equal_official_post_processing(gdino_dir):
    options = {"box_threshold": 0.3, "text_threshold": 0.25}
    reward = mmreward.load("geneval", checkpoint=gdino_dir, detector="grounding-dino", detector_options=options)
    names = [["cat", "dog"], ["teddy bear"], ["red", "apple", "cat"]]
    batch = images(3)
    found = reward.detector.detect(batch, names)
    total = 0
    for image, ns, ours in zip(batch, names, found):
        ref = reference_detections(gdino_dir, image, ns, **options)
        assert [d.label for d in ours] == [r[0] for r in ref]
        torch.testing.assert_close(torch.tensor([d.score for d in ours]), torch.tensor([r[1] for r in ref]), atol=1e-5, rtol=0)
        # boxes are in pixels: the tolerance follows the image size
        assert_close_scaled(
            torch.tensor([d.box for d in ours]).reshape(-1, 4), torch.tensor([r[2] for r in ref]).reshape(-1, 4),
            rel=1e-5,
        )  # fmt: skip
        total += len(ours)
        assert {d.label for d in ours} <= set(ns)
    assert total > 0  # the thresholds let detections through, so the comparison is not vacuous


def test_thresholds_nms_and_errors(gdino_dir):
    from mmreward.geneval.grounding_dino import load_grounding_dino

    batch = images(2, seed=1)
    names = [["cat", "dog"], ["dog"]]
    loose = load_grounding_dino(gdino_dir, box_threshold=0.2, text_threshold=0.2).detect(batch, names)
    strict = load_grounding_dino(gdino_dir, box_threshold=0.9, text_threshold=0.2).detect(batch, names)
    assert sum(map(len, loose)) >= sum(map(len, strict)) and sum(map(len, loose)) > 0
    assert all(d.score > 0.9 for ds in strict for d in ds)
    assert load_grounding_dino(gdino_dir, box_threshold=1.0).detect(batch, names) == [[], []]
    assert loose[1] and load_grounding_dino(gdino_dir, box_threshold=0.2).detect(batch, [["cat"], []])[1] == []
    assert load_grounding_dino(gdino_dir, box_threshold=0.0, text_threshold=1.0).detect(batch, names) == [[], []]
    merged = load_grounding_dino(gdino_dir, box_threshold=0.2, text_threshold=0.2, nms_iou=0.01).detect(batch, names)
    for ds in merged:  # with NMS at IoU 0.01, boxes of one class do not overlap
        from torchvision.ops import box_iou

        for label in {d.label for d in ds}:
            boxes = torch.tensor([d.box for d in ds if d.label == label])
            iou = box_iou(boxes, boxes) - torch.eye(len(boxes))
            assert float(iou.max()) <= 0.01
    assert caption_and_spans(["cat", "teddy bear"]) == ("cat. teddy bear.", [(0, 3), (5, 15)])
    with pytest.raises(RewardInputError, match="separates class names"):
        load_grounding_dino(gdino_dir).detect(batch[:1], [["st. bernard"]])
    with pytest.raises(ConfigError, match="box_threshold"):
        load_grounding_dino(gdino_dir, box_threshold=1.5)
    with pytest.raises(CheckpointError, match="cannot load the Grounding DINO"):
        load_grounding_dino(gdino_dir / "missing")


def test_geneval_reward_with_grounding_dino(gdino_dir):
    reward = mmreward.load(
        "geneval", checkpoint=gdino_dir, detector="grounding-dino", score="dense",
        detector_options={"box_threshold": 0.2, "text_threshold": 0.2}, score_threshold=0.2, counting_threshold=0.2,
    )  # fmt: skip
    out = reward.score(["a photo of a cat and a dog", "a photo of two dogs"], torch.stack(images(2, seed=2)))
    assert out.scores.shape == (2,) and bool((out.scores <= 1).all())  # dense: negative with many extra objects
    assert out.rationales is not None and len(out.rationales) == 2
    with pytest.raises(ConfigError, match="grounding-dino"):
        mmreward.load("geneval", detector="groundingdino")


def test_random_grounding_dino_geneval_passes_conformance():
    from mmreward.testing.conformance import check_conformance

    reward = mmreward.load(
        "geneval", detector="grounding-dino", weights="random", score="dense", score_threshold=0.5,
        counting_threshold=0.5, detector_options={"box_threshold": 0.2, "text_threshold": 0.2},
    )  # fmt: skip
    check_conformance(reward)
