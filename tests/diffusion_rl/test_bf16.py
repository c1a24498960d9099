"""bf16 scores of every image family stay within a stated tolerance of fp32 and keep a batch's ranking (CPU).

Both rewards are built tiny with the same seeded random weights (`tiny_options`), one with dtype="bf16",
and score one batch: the five sample photos in assets/samples and three smooth random colour fields,
chosen because they spread the scores of random-weight models more than noise images do.

The tolerance is on max |bf16 - fp32| as a fraction of the batch's fp32 spread (max - min), the scale a
ranking or an advantage sees. A pair of items whose fp32 gap exceeds twice that bound must keep its
order, and at least a third of the pairs must be that well separated, so the batch can show a ranking.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

import mmreward
from mmreward.media import to_batch
from mmreward.testing.conformance import PROMPTS

SAMPLES = Path(__file__).resolve().parents[2] / "assets" / "samples"
SIZE = 64
BATCH = 8

# name -> (max |bf16 - fp32| / fp32 spread, why). 0.0: the scores must be identical. A bf16 family's
# tolerance is about twice the deviation measured on CPU (README, "Precision"), at least 0.02: loose enough
# for other CPUs' bf16 kernels, tight enough that a head or a logit scale rounded to bf16 fails.
FAMILIES: dict[str, tuple[float, str]] = {
    # no torch floating network: dtype="bf16" is accepted and changes nothing
    "jpeg-compressibility": (0.0, "PIL's JPEG encoder on uint8 pixels; no network"),
    "jpeg-incompressibility": (0.0, "PIL's JPEG encoder on uint8 pixels; no network"),
    "mock": (0.0, "a closed-form colour distance; no weights"),
    "shapes-eval": (0.0, "the exact analytic ShapesWorld checker; no network"),
    "ocr": (0.0, "PaddleOCR ONNX graphs on onnxruntime in fp32; torch dtypes do not reach them"),
    "nudenet": (0.0, "an ONNX detector on onnxruntime in fp32; torch dtypes do not reach it"),
    "open-nsfw": (0.0, "an ONNX classifier on onnxruntime in fp32; torch dtypes do not reach it"),
    # kept wholly in fp32 by the family's precision policy (keep_fp32 in its model file)
    "face-mtcnn": (0.0, "MTCNN is a thresholded, NMS-ed cascade of tiny CNNs: kept fp32"),
    "imagenet-classifier": (0.0, "MobileNetV2 drifts 14% in bf16 (depthwise convs): kept fp32, 3.5M parameters"),
    # a bf16 trunk with fp32 heads, logit scales, norms and softmaxes
    "aesthetic": (0.025, "bf16 CLIP tower, fp32 L2 norm and MLP head (a bf16 head measures 0.032)"),
    "clipscore": (0.02, "bf16 CLIP towers, cosine in fp32"),
    "hpsv2": (0.02, "bf16 open_clip towers, cosine in fp32"),
    "hpsv2.1": (0.02, "bf16 open_clip towers, cosine in fp32"),
    "pickscore": (0.03, "bf16 CLIP towers, fp32 logit_scale and cosine"),
    "shapesworld-pref": (0.04, "bf16 CLIP towers, fp32 logit_scale and cosine"),
    "shapesworld-aesthetic": (0.04, "bf16 vision tower, fp32 L2 norm and head"),
    "preference-head": (0.04, "bf16 CLIP backbone, fp32 norms and trained head"),
    "imagereward": (0.04, "bf16 BLIP, fp32 MLP head"),
    # HPSv3's positions are sequential over every token, as its original's forward (not M-RoPE): the tiny
    # random model then spreads 0.14 over the batch and bf16 rounding measures 0.10 of that spread
    "hpsv3": (0.12, "bf16 Qwen2-VL with sequential positions, fp32 reward head"),
    "realism-classifier": (0.02, "bf16 ViT classifier, fp32 softmax/sigmoid of its logits"),
    "skywork-vl-reward": (0.06, "bf16 Qwen2.5-VL, fp32 value head on the last token (measured 0.042)"),
    "unifiedreward": (0.05, "bf16 Qwen2-VL, fp32 log-softmax over the score tokens"),
    "unifiedreward-think": (0.02, "bf16 Qwen2-VL, fp32 log-softmax over the score tokens"),
    "vqascore": (0.07, "bf16 Qwen2-VL, fp32 log-softmax over the yes token"),
    "paco-reward": (0.05, "bf16 Qwen2-VL, fp32 softmax over yes/no"),
    "visual-prm": (0.09, "bf16 InternVL, fp32 softmax over the '+'/'-' logits at each step's verdict position (measured 0.044)"),
    # A random tiny CLIP's features barely depend on the image, so sigmoid(probe) spreads only 0.02
    # around 0.5 while bf16 rounding of the features (~0.5%) is a fixed fraction of their size.
    "univfd": (0.15, "bf16 CLIP tower, fp32 probe and sigmoid; random features spread little"),
    "realgen-detectors": (0.09, "weighted sum including univfd (above)"),
    # discrete: thresholded detections; no detection score of this batch lies within bf16 error of a threshold
    "geneval": (0.0, "bf16 OWLv2 trunk, fp32 class and box heads; scores are thresholded counts"),
}
# families whose network must really compute in bf16 (the cast reached it), not just accept the option
COMPUTES_IN_BF16 = {n for n, (tol, _) in FAMILIES.items() if tol > 0} | {"geneval"}

MEASURED: dict[str, float] = {}


def image_families() -> list[str]:
    from mmreward.edit import SCORED_WITH_SOURCES  # scored against source images, not a media batch alone

    return sorted(n for n in mmreward.list_rewards() if "image" in mmreward.get_spec(n).modalities
                  and n not in SCORED_WITH_SOURCES)


def sample_batch() -> torch.Tensor:
    photos = [to_batch([p])[0][:3] for p in sorted(SAMPLES.glob("*.png"))]
    photos = [torch.nn.functional.interpolate(p[None], size=(SIZE, SIZE), mode="bilinear", antialias=True)[0]
              for p in photos]
    g = torch.Generator().manual_seed(0)
    fields = torch.nn.functional.interpolate(
        torch.rand(BATCH - len(photos), 3, 4, 4, generator=g), size=(SIZE, SIZE), mode="bilinear"
    )
    return torch.cat([torch.stack(photos), fields]).clamp(0, 1)


def load_pair(name: str):
    spec = mmreward.get_spec(name)
    missing = spec.missing_requirements()
    if missing:
        pytest.skip(f"{name} needs {missing} (extra '{spec.extra}')")
    torch.manual_seed(0)
    fp32 = mmreward.load(name, weights="random", **spec.tiny_options)
    torch.manual_seed(0)
    bf16 = mmreward.load(name, weights="random", dtype="bf16", **spec.tiny_options)
    return fp32, bf16


# response rewards score (question, image, response): no float network that bf16 could change, and the test batch
# has no responses to score
NOT_COMPARED = {"shapes-vqa": "an exact answer checker (ResponseReward); no network",
                "r1-reward": "a generative pairwise critic: its default output is a 0/1 verdict per order (bf16 drift "
                "of the soft mode not measured)"}


def test_every_image_family_is_covered():
    assert sorted(FAMILIES) == [n for n in image_families() if n not in NOT_COMPARED]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_bf16_scores_stay_close_to_fp32_and_keep_the_ranking(name):
    tol, why = FAMILIES[name]
    fp32, bf16 = load_pair(name)
    assert bf16.dtype == (torch.bfloat16 if name in COMPUTES_IN_BF16 else torch.float32)
    sd32 = fp32.state_dict()
    for key, value in bf16.state_dict().items():  # same weights, up to the cast: the comparison is fair
        assert torch.equal(value, sd32[key].to(value.dtype)), f"{name}: {key} differs beyond the bf16 cast"
    media = sample_batch()
    prompts = (PROMPTS * 2)[:BATCH]
    s32 = fp32.score(prompts, media).scores
    s16 = bf16.score(prompts, media).scores
    assert s16.dtype == torch.float32
    finite = torch.isfinite(s32)
    assert torch.equal(finite, torch.isfinite(s16)), f"{name}: bf16 changed which scores are NaN"
    s32, s16 = s32[finite], s16[finite]
    spread = float(s32.max() - s32.min())
    assert spread > 0, f"{name}: fp32 scores are constant on the test batch; the comparison says nothing"
    deviation = float((s16 - s32).abs().max()) / spread
    MEASURED[name] = deviation
    print(f"\n{name}: max |bf16 - fp32| = {deviation:.4f} of the fp32 spread {spread:.4g} (tolerance {tol}: {why})")
    if tol == 0.0:
        torch.testing.assert_close(s16, s32, rtol=0, atol=0)
        return
    assert deviation <= tol, f"{name}: bf16 deviates {deviation:.3f} of the fp32 spread > {tol} ({why})"
    bound = tol * spread
    pairs = list(itertools.combinations(range(len(s32)), 2))
    separated = [(i, j) for i, j in pairs if abs(float(s32[i] - s32[j])) > 2 * bound]
    assert len(separated) * 3 >= len(pairs), f"{name}: the batch is too flat to show a ranking at this tolerance"
    for i, j in separated:
        assert torch.sign(s16[i] - s16[j]) == torch.sign(s32[i] - s32[j]), f"{name}: bf16 swapped items {i} and {j}"


DIFFERENTIABLE = [n for n in sorted(FAMILIES) if mmreward.get_spec(n).differentiable]


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_bf16_gradients_reach_the_pixels_finite(name):
    _, bf16 = load_pair(name)
    media = sample_batch()[:4].requires_grad_(True)
    scores = bf16.score(PROMPTS, media).scores
    scores.sum().backward()
    assert media.grad is not None and media.grad.dtype == torch.float32
    assert torch.isfinite(media.grad).all(), f"{name}: non-finite pixel gradients in bf16"
    assert media.grad.abs().sum() > 0, f"{name}: zero pixel gradients in bf16"


def test_kept_fp32_tensors_keep_their_exact_values_through_a_bf16_cast():
    fp32, bf16 = load_pair("pickscore")
    assert bf16.dtype == torch.bfloat16
    scale = bf16.backbone.model.logit_scale
    assert scale.dtype == torch.float32
    assert torch.equal(scale, fp32.backbone.model.logit_scale)  # not rounded through bf16 and back
    aesthetic32, aesthetic16 = load_pair("aesthetic")
    for p16, p32 in zip(aesthetic16.head.parameters(), aesthetic32.head.parameters()):
        assert p16.dtype == torch.float32 and torch.equal(p16, p32)
    assert next(aesthetic16.backbone.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize(("name", "path"), [("pickscore", "backbone.model"), ("shapesworld-pref", "model")])
def test_a_real_logit_scale_of_100_survives_bf16(name, path):
    """The real checkpoints' ln(100) rounds to 4.594 in bf16: exp gives 98.9, every score 1.1% low."""
    reward = mmreward.load(name, weights="random", **mmreward.get_spec(name).tiny_options)
    with torch.no_grad():
        reward.get_submodule(path).logit_scale.fill_(math.log(100.0))
    reward = reward.to(dtype=torch.bfloat16)
    scale = reward.get_submodule(path).logit_scale
    torch.testing.assert_close(scale.exp(), torch.tensor(100.0), rtol=1e-6, atol=0)


class _TrunkHead(mmreward.Reward):
    keep_fp32 = ("head", "scale", "missing.path")  # a path this reward lacks is skipped

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(4, 1)
        self.register_buffer("scale", torch.tensor(1 / 3))

    def _score(self, prompts, media):
        x = media.mean(dim=(-1, -2)).to(self.dtype)
        return mmreward.RewardOutput(self.head(self.trunk(x)).squeeze(-1) * self.scale)


def test_keep_fp32_holds_through_half_and_buffers_and_feeds_the_head_fp32():
    reward = _TrunkHead()
    head_weight, scale = reward.head.weight.detach().clone(), reward.scale.clone()
    reward = reward.half()
    assert reward.dtype == torch.float16 and reward.trunk.weight.dtype == torch.float16
    assert reward.head.weight.dtype == torch.float32 and torch.equal(reward.head.weight, head_weight)
    assert reward.scale.dtype == torch.float32 and torch.equal(reward.scale, scale)
    out = reward.score(["x"] * 2, torch.rand(2, 3, 8, 8))  # fp16 trunk output enters the fp32 head
    assert torch.isfinite(out.scores).all()
