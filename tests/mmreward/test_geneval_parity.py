"""GenEval parity: our accuracy / strict / dense score and CLIP colour classifier against the originals' code.

References transcribed below, independently of `mmreward.geneval` (numpy on mmdet-style per-class
(N, 5) box arrays, Pillow crops, open_clip directly), from
- djghosh13/geneval@af4902f24d3ca90ebbb446dd9891a59e0f82725f evaluation/evaluate_images.py
  (`evaluate_image`'s box selection, `compute_iou`, `relative_position`, `evaluate`, `ImageCrops`,
  `color_classification`),
- yifan123/reward-server@92ac29fb322c028f8840db8f93c950422931710d reward_server/gen_eval.py
  (`evaluate_reward`: `strict_correct` and the dense `score`),
- LAION-AI/CLIP_benchmark@48de38c1689fa6d8b4dd53e3370c669c3bb18117
  clip_benchmark/metrics/zeroshot_classification.py (`zero_shot_classifier`, `run_classification`).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmreward.geneval import Detection
from mmreward.geneval.evaluate import Thresholds, evaluate
from mmreward.geneval.prompt_parser import spec_from_metadata
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
CLASSES = ["dog", "cat", "apple", "car"]


# ------------------------------------------------------------------ transcribed reference (originals' logic)
class Original:
    def __init__(self, color_of, threshold=0.3, counting_threshold=0.9, max_objects=16, nms=1.0, position=0.1):
        self.color_of = color_of  # stands in for CLIP: (bbox row) -> colour name
        self.THRESHOLD, self.COUNTING_THRESHOLD, self.MAX_OBJECTS = threshold, counting_threshold, max_objects
        self.NMS_THRESHOLD, self.POSITION_THRESHOLD = nms, position

    def color_classification(self, found_objects):
        return [self.color_of(box) for box, _ in found_objects]

    @staticmethod
    def compute_iou(box_a, box_b):
        area_fn = lambda box: max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)  # noqa: E731
        i_area = area_fn([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
        u_area = area_fn(box_a) + area_fn(box_b) - i_area
        return i_area / u_area if u_area else 0

    def relative_position(self, obj_a, obj_b):
        boxes = np.array([obj_a[0], obj_b[0]])[:, :4].reshape(2, 2, 2)
        center_a, center_b = boxes.mean(axis=-2)
        dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
        offset = center_a - center_b
        revised_offset = np.maximum(np.abs(offset) - self.POSITION_THRESHOLD * (dim_a + dim_b), 0) * np.sign(offset)
        if np.all(np.abs(revised_offset) < 1e-3):
            return set()
        dx, dy = revised_offset / np.linalg.norm(offset)
        relations = set()
        if dx < -0.5:
            relations.add("left of")
        if dx > 0.5:
            relations.add("right of")
        if dy < -0.5:
            relations.add("above")
        if dy > 0.5:
            relations.add("below")
        return relations

    def select(self, bbox, metadata):
        detected = {}
        confidence_threshold = self.THRESHOLD if metadata["tag"] != "counting" else self.COUNTING_THRESHOLD
        for index, classname in enumerate(CLASSES):
            ordering = np.argsort(bbox[index][:, 4])[::-1]
            ordering = ordering[bbox[index][ordering, 4] > confidence_threshold]
            ordering = ordering[: self.MAX_OBJECTS].tolist()
            detected[classname] = []
            while ordering:
                max_obj = ordering.pop(0)
                detected[classname].append((bbox[index][max_obj], None))
                ordering = [o for o in ordering if self.NMS_THRESHOLD == 1
                            or self.compute_iou(bbox[index][max_obj], bbox[index][o]) < self.NMS_THRESHOLD]
            if not detected[classname]:
                del detected[classname]
        return detected

    def evaluate(self, objects, metadata):
        correct = True
        matched_groups = []
        for req in metadata.get("include", []):
            classname = req["class"]
            matched = True
            found_objects = objects.get(classname, [])[: req["count"]]
            if len(found_objects) < req["count"]:
                correct = matched = False
            else:
                if "color" in req:
                    colors = self.color_classification(found_objects)
                    if colors.count(req["color"]) < req["count"]:
                        correct = matched = False
                if "position" in req and matched:
                    expected_rel, target_group = req["position"]
                    if matched_groups[target_group] is None:
                        correct = matched = False
                    else:
                        for obj in found_objects:
                            for target_obj in matched_groups[target_group]:
                                if expected_rel not in self.relative_position(obj, target_obj):
                                    correct = matched = False
                                    break
                            if not matched:
                                break
            matched_groups.append(found_objects if matched else None)
        for req in metadata.get("exclude", []):
            if len(objects.get(req["class"], [])) >= req["count"]:
                correct = False
        return correct

    def evaluate_reward(self, objects, metadata):
        correct = True
        rewards = []
        matched_groups = []
        for req in metadata.get("include", []):
            classname = req["class"]
            matched = True
            found_objects = objects.get(classname, [])
            rewards.append(1 - abs(req["count"] - len(found_objects)) / req["count"])
            if len(found_objects) != req["count"]:
                correct = matched = False
                if "color" in req or "position" in req:
                    rewards.append(0.0)
            else:
                if "color" in req:
                    colors = self.color_classification(found_objects)
                    rewards.append(1 - abs(req["count"] - colors.count(req["color"])) / req["count"])
                    if colors.count(req["color"]) != req["count"]:
                        correct = matched = False
                if "position" in req and matched:
                    expected_rel, target_group = req["position"]
                    if matched_groups[target_group] is None:
                        correct = matched = False
                        rewards.append(0.0)
                    else:
                        for obj in found_objects:
                            for target_obj in matched_groups[target_group]:
                                if expected_rel not in self.relative_position(obj, target_obj):
                                    correct = matched = False
                                    rewards.append(0.0)
                                    break
                            if not matched:
                                break
                        rewards.append(1.0)
            matched_groups.append(found_objects if matched else None)
        reward = sum(rewards) / len(rewards) if rewards else 0
        return correct, reward


# ------------------------------------------------------------------ synthetic detection sets
def _metadata(rng: random.Random) -> dict:
    """A row as GenEval's prompts/create_prompts.py writes them."""
    tag = rng.choice(["single_object", "two_object", "counting", "colors", "position", "color_attr"])
    a, b = rng.sample(CLASSES, 2)
    if tag == "single_object":
        return {"tag": tag, "include": [{"class": a, "count": 1}]}
    if tag == "two_object":
        return {"tag": tag, "include": [{"class": a, "count": 1}, {"class": b, "count": 1}]}
    if tag == "counting":
        n = rng.randint(1, 4)
        return {"tag": tag, "include": [{"class": a, "count": n}], "exclude": [{"class": a, "count": n + 1}]}
    if tag == "colors":
        return {"tag": tag, "include": [{"class": a, "count": 1, "color": rng.choice(COLORS[:3])}]}
    if tag == "position":
        rel = rng.choice(["left of", "right of", "above", "below"])
        return {"tag": tag, "include": [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [rel, 0]}]}
    return {"tag": tag, "include": [{"class": a, "count": 1, "color": rng.choice(COLORS[:3])},
                                    {"class": b, "count": 1, "color": rng.choice(COLORS[:3])}]}


def _bboxes(rng: random.Random, metadata: dict) -> list[np.ndarray]:
    """Per class an (N, 5) float32 array [x1, y1, x2, y2, score] as mmdet returns; distinct scores (no sort ties)."""
    wanted = {r["class"]: r["count"] for r in metadata["include"]}
    out = []
    for name in CLASSES:
        n = rng.choice([0, 1, 1, 2, 3, 5]) if name in wanted else rng.choice([0, 0, 1])
        if name in wanted and rng.random() < 0.4:
            n = wanted[name]  # often exactly the asked count, so colour and position terms are reached
        if name in wanted and metadata["tag"] == "counting":
            n = max(0, wanted[name] + rng.choice([-1, 0, 1, 2, 4]))  # around the count, past it for the exclude
        rows = []
        for _ in range(n):
            x, y = rng.uniform(0, 400), rng.uniform(0, 400)
            w, h = rng.uniform(5, 150), rng.uniform(5, 150)
            score = rng.choice([rng.uniform(0, 1), rng.uniform(0.85, 1.0), rng.uniform(0.9, 1.0)])
            rows.append([x, y, x + w, y + h, score])
        out.append(np.array(rows, dtype=np.float32).reshape(-1, 5))
    return out


@pytest.mark.parity
@pytest.mark.parametrize("nms", [1.0, 0.5])
def test_accuracy_strict_and_dense_score_match_the_originals(nms):
    rng = random.Random(1234 + int(nms * 10))
    colour_table: dict[tuple, str] = {}

    def color_of_box(box) -> str:  # one colour per box, shared by both sides
        key = tuple(round(float(v), 3) for v in box[:4])
        return colour_table.setdefault(key, rng.choice(COLORS[:3]))

    original = Original(color_of_box, nms=nms)
    thresholds = Thresholds(max_overlap=nms)
    ours_all, ref_all, reached = [], [], {"color": 0, "position": 0, "exclude": 0, "ge_not_eq": 0}
    for _ in range(800):
        meta = _metadata(rng)
        bbox = _bboxes(rng, meta)
        objects = original.select(bbox, meta)
        ref_correct = original.evaluate(objects, meta)
        ref_strict, ref_score = original.evaluate_reward(objects, meta)
        dets = [Detection(name, float(row[4]), tuple(float(v) for v in row[:4]))
                for name, rows in zip(CLASSES, bbox) for row in rows]
        ev = evaluate(spec_from_metadata(json.loads(json.dumps(meta))), dets,
                      colors=lambda objs, _name: [color_of_box(d.box) for d in objs], thresholds=thresholds)
        assert (ev.accuracy, ev.strict) == (ref_correct, ref_strict), (meta, objects)
        ours_all.append(ev.score)
        ref_all.append(ref_score)
        reached["color"] += any("color" in r for r in meta["include"]) and ref_score not in (0.0,)
        reached["position"] += meta["tag"] == "position" and len(ev.terms) == 4
        first = meta["include"][0]
        reached["exclude"] += meta["tag"] == "counting" and len(objects.get(first["class"], [])) > first["count"]
        reached["ge_not_eq"] += ref_correct and not ref_strict
    ours_t, ref_t = torch.tensor(ours_all, dtype=torch.float64), torch.tensor(ref_all, dtype=torch.float64)
    record_parity("geneval (rules)", original="djghosh13/geneval@af4902f evaluate_images.py; yifan123/reward-server@92ac29f "
                  "gen_eval.py", how="transcribed", actual=ours_t, expected=ref_t, cases=["800 synthetic detection sets"],
                  not_checked="detector (its own rows: geneval-mask2former); colours from a shared table (the CLIP path is its own test)")
    assert_close_scaled(ours_t, ref_t, rel=1e-12, scale=1.0)
    assert all(v > 10 for v in reached.values()), reached  # every branch family exercised
    assert len({round(s, 6) for s in ref_all}) > 5  # the dense score takes many values, negative ones included
    assert min(ref_all) < 0


# ------------------------------------------------------------------ CLIP colour classifier
TINY_OPEN_CLIP = {
    "embed_dim": 16, "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}  # fmt: skip


def _save_tiny_open_clip(folder, seed=0):
    from open_clip.model import CLIP

    torch.manual_seed(seed)
    model = CLIP(**TINY_OPEN_CLIP).eval()
    with torch.no_grad():  # spread the random class vectors so the argmax is not decided by float noise
        model.text_projection.mul_(4.0)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_OPEN_CLIP, "preprocess_cfg": {}}))
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    return folder


def _reference_logits(folder, image_pil, objects, classname):
    """GenEval's ImageCrops + clip_benchmark's zero-shot classifier on open_clip, as the originals run them."""
    from open_clip import image_transform
    from open_clip.model import CLIP
    from open_clip.tokenizer import SimpleTokenizer
    from PIL import Image

    model = CLIP(**TINY_OPEN_CLIP).eval()
    model.load_state_dict(torch.load(folder / "open_clip_pytorch_model.bin", weights_only=True))
    transform = image_transform(TINY_OPEN_CLIP["vision_cfg"]["image_size"], is_train=False)
    tokenizer = SimpleTokenizer()
    templates = [f"a photo of a {{c}} {classname}", f"a photo of a {{c}}-colored {classname}", "a photo of a {c} object"]
    with torch.no_grad():
        weights = []
        for c in COLORS:
            emb = F.normalize(model.encode_text(tokenizer([t.format(c=c) for t in templates])), dim=-1).mean(dim=0)
            weights.append(emb / emb.norm())
        classifier = torch.stack(weights, dim=1)
        image = image_pil.convert("RGB")
        blank = Image.new("RGB", image.size, color="#999")
        crops = []
        for box, mask in objects:
            crop = Image.composite(image, blank, Image.fromarray(mask)) if mask is not None else image
            crops.append(transform(crop.crop(tuple(box[:4]))))  # tuple(): Pillow 13 no longer takes an array
        feats = F.normalize(model.encode_image(torch.stack(crops)), dim=-1)
        return 100.0 * feats @ classifier


@pytest.mark.parity
def test_clip_colour_classifier_matches_geneval_crops_and_zero_shot(tmp_path):
    from PIL import Image

    from mmreward.geneval.clip_colors import load_clip_colors

    folder = _save_tiny_open_clip(tmp_path)
    clf = load_clip_colors(str(folder))
    gen = torch.Generator().manual_seed(0)
    ours_all, ref_all, names_ours, names_ref = [], [], [], []
    for h, w in [(64, 64), (48, 80), (77, 53)]:  # square and odd sizes
        image = torch.rand(3, h, w, generator=gen)
        pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        objs, dets = [], []
        for k in range(5):
            x1, y1 = float(torch.rand(1, generator=gen)) * w * 0.6 - 4, float(torch.rand(1, generator=gen)) * h * 0.6
            box = np.array([x1, y1, x1 + 6.5 + k * 5.3, y1 + 7.25 + k * 4.1, 0.9], dtype=np.float32)  # some past the edge
            mask = None if k == 0 else (torch.rand(h, w, generator=gen) > 0.4).numpy()
            objs.append((box, mask))
            dets.append(Detection("dog", 0.9, tuple(float(v) for v in box[:4]), mask=mask))
        ref = _reference_logits(folder, Image.fromarray(pixels), objs, "dog")
        ours = clf.logits(image, dets, "dog")
        ours_all.append(ours)
        ref_all.append(ref)
        names_ours += clf.classify(image, dets, "dog")
        names_ref += [COLORS[int(i)] for i in ref.argmax(1)]
    ours_t, ref_t = torch.cat(ours_all), torch.cat(ref_all)
    record_parity("geneval (CLIP colours)", original="djghosh13/geneval@af4902f evaluate_images.py ImageCrops/"
                  "color_classification + CLIP_benchmark@48de38c zero_shot_classifier, open_clip", how="transcribed",
                  actual=ours_t, expected=ref_t, cases=["RGB", "odd sizes", "masks and no mask", "boxes past the edge"],
                  not_checked="real ViT-L/14 weights (tiny random open_clip); fp16 autocast of the original")
    spread = float(ref_t.max() - ref_t.min())
    assert_close_scaled(ours_t, ref_t, rel=1e-4, scale=spread)
    assert names_ours == names_ref
    assert len(set(names_ref)) > 1  # the tiny CLIP does not name one colour for everything


def test_reward_names_colours_with_the_clip_checkpoint(tmp_path):
    import mmreward
    from mmreward.geneval.clip_colors import load_clip_colors

    folder = _save_tiny_open_clip(tmp_path)
    image = torch.rand(1, 3, 40, 40, generator=torch.Generator().manual_seed(3))
    box = (2.0, 3.0, 30.0, 33.0)
    colour = load_clip_colors(str(folder)).classify(image[0], [Detection("dog", 0.9, box)], "dog")[0]

    class Canned:
        def detect(self, images, names):
            return [[Detection("dog", 0.9, box)]]

    reward = mmreward.load("geneval", detector=Canned(), color_checkpoint=str(folder), score="dense")
    other = next(c for c in COLORS if c != colour)
    out = reward.score([f"a photo of a {colour} dog"], image)
    assert out.scores.tolist() == [1.0] and out.details["accuracy"].tolist() == [1.0]
    out = reward.score([f"a photo of a {other} dog"], image)
    assert out.scores.tolist() == [0.5] and out.details["strict"].tolist() == [0.0]  # count term 1, colour term 0
