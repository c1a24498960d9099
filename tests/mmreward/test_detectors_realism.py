"""Realism rewards: label maps, transformers detectors vs the transformers pipeline, UnivFD vs its validate.py
recipe, and RealGen's weighted detector sum. Tiny random checkpoints are written in the official formats."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

import mmreward
from mmreward.errors import CheckpointError, ConfigError
from mmreward.models.real_fake_labels import RealOutput, resolve_real_output
from mmreward.testing.tiny_realism import save_tiny_image_classifier, save_tiny_univfd
from tests._helpers.parity_record import record_parity

UNIVFD = "WisconsinAIVision/UniversalFakeDetect validate.py transform + models/clip_models.py forward"


def quantized_images(sizes, seed=0):
    """Smooth random images holding exact uint8 levels, so file-based references see the same pixels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in sizes:
        base = torch.rand(1, 3, 4, 4, generator=g)
        img = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)[0]
        img = (img + 0.2 * torch.rand(3, h, w, generator=g)).clamp(0, 1)
        out.append((img * 255).round() / 255)
    return out


def to_pil(img: torch.Tensor) -> Image.Image:
    return Image.fromarray((img * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())


# ----------------------------------------------------------------------------------------------
# label maps
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("id2label", "expected"),
    [
        ({0: "fake", 1: "real"}, RealOutput(1)),
        ({0: "artificial", 1: "human"}, RealOutput(1)),  # umm-maybe/AI-image-detector, Organika/sdxl-detector
        ({0: "REAL", 1: "FAKE"}, RealOutput(0)),
        ({0: "AI-generated", 1: "LABEL_1"}, RealOutput(1)),  # two classes, one fake-like: the other is real
        ({0: "real", 1: "sd", 2: "midjourney", 3: "dalle"}, RealOutput(0)),
        ({0: "not_real", 1: "LABEL_1"}, RealOutput(1)),
        ({0: "fake"}, RealOutput(0, negate=True)),  # single logit for "fake": P(real) = 1 - sigmoid
        ({0: "real"}, RealOutput(0)),
        ({"0": "Realness unknown", "1": "nature photo"}, RealOutput(1)),  # string keys as in config.json
    ],
)
def test_label_map_resolution(id2label, expected):
    assert resolve_real_output(id2label) == expected


def test_label_map_overrides_and_errors():
    plain = {0: "LABEL_0", 1: "LABEL_1"}
    with pytest.raises(ConfigError, match=r"real_label=<index or name>"):
        resolve_real_output(plain)
    with pytest.raises(ConfigError, match="cannot tell"):
        resolve_real_output({0: "sd", 1: "midjourney", 2: "dalle"})
    with pytest.raises(ConfigError, match="cannot tell"):
        resolve_real_output({0: "real", 1: "human"})  # two real-like classes
    assert resolve_real_output(plain, real_label=0) == RealOutput(0)
    assert resolve_real_output(plain, real_label="label_1") == RealOutput(1)
    assert resolve_real_output(plain, real_label="1") == RealOutput(1)
    assert resolve_real_output(plain, fake_label=0) == RealOutput(1)
    assert resolve_real_output({0: "LABEL_0"}, fake_label=0) == RealOutput(0, negate=True)
    # the override wins over the names
    assert resolve_real_output({0: "fake", 1: "real"}, real_label="fake") == RealOutput(0)
    with pytest.raises(ConfigError, match="out of range"):
        resolve_real_output(plain, real_label=2)
    with pytest.raises(ConfigError, match="is not a label"):
        resolve_real_output(plain, real_label="human")
    with pytest.raises(ConfigError, match="two-class or single-logit"):
        resolve_real_output({0: "a", 1: "b", 2: "c"}, fake_label=0)
    with pytest.raises(ConfigError, match="either real_label or fake_label"):
        resolve_real_output(plain, real_label=0, fake_label=1)


# ----------------------------------------------------------------------------------------------
# transformers image-classification detectors
# ----------------------------------------------------------------------------------------------
def pipeline_p_real(folder, images, real_name):
    from transformers import pipeline

    pipe = pipeline("image-classification", model=str(folder), device="cpu")
    preds = pipe([to_pil(x) for x in images], top_k=None)
    return torch.tensor([next(p["score"] for p in pred if p["label"] == real_name) for pred in preds])


@pytest.mark.parity
@pytest.mark.parametrize(
    ("arch", "id2label", "real_name"),
    [("vit", {0: "fake", 1: "real"}, "real"), ("convnext", {0: "REAL", 1: "FAKE"}, "REAL")],
)
def test_classifier_equals_transformers_pipeline(tmp_path, arch, id2label, real_name):
    save_tiny_image_classifier(tmp_path, arch=arch, id2label=id2label)
    reward = mmreward.load("realism-classifier", checkpoint=tmp_path)
    images = quantized_images([(40, 52), (40, 52), (64, 48)])  # mixed sizes: a list batch
    out = reward.score(None, images)
    expected = pipeline_p_real(tmp_path, images, real_name)
    import transformers

    record_parity("realism-classifier", original=f"transformers=={transformers.__version__} pipeline('image-"
                  "classification')", how="package", actual=out.scores, expected=expected, cases=("RGB", "odd size"))
    torch.testing.assert_close(out.scores, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.details["p_fake"], 1 - expected, atol=1e-5, rtol=0)
    assert out.scores.std() > 1e-4  # the images are told apart


def test_classifier_single_logit_and_unnamed_labels(tmp_path):
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    single = save_tiny_image_classifier(tmp_path / "single", id2label={0: "fake"})
    reward = mmreward.load("realism-classifier", checkpoint=single)
    images = quantized_images([(32, 32), (48, 40)], seed=1)
    model = AutoModelForImageClassification.from_pretrained(single).eval()
    processor = AutoImageProcessor.from_pretrained(single)
    with torch.no_grad():
        logits = torch.cat([model(**processor(images=to_pil(x), return_tensors="pt")).logits for x in images])
    torch.testing.assert_close(reward.score(None, images).scores, 1 - torch.sigmoid(logits[:, 0]), atol=1e-5, rtol=0)

    unnamed = save_tiny_image_classifier(tmp_path / "unnamed", id2label={0: "LABEL_0", 1: "LABEL_1"})
    with pytest.raises(ConfigError, match="real_label"):
        mmreward.load("realism-classifier", checkpoint=unnamed)
    reward = mmreward.load("realism-classifier", checkpoint=unnamed, real_label="LABEL_0")
    torch.testing.assert_close(
        reward.score(None, images).scores, pipeline_p_real(unnamed, images, "LABEL_0"), atol=1e-5, rtol=0
    )


def test_classifier_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="cannot load"):
        mmreward.load("realism-classifier", checkpoint=tmp_path / "missing")
    with pytest.raises(CheckpointError, match="no default checkpoint"):
        mmreward.load("realism-classifier")


def test_classifier_differentiable_path(tmp_path):
    save_tiny_image_classifier(tmp_path, arch="vit")
    reward = mmreward.load("realism-classifier", checkpoint=tmp_path)
    x = torch.stack(quantized_images([(40, 52)] * 2, seed=2)).requires_grad_(True)
    y = reward.score(None, x).scores
    y.sum().backward()
    # float pixels are resized without the uint8 rounding of the scoring path: equal up to that rounding
    torch.testing.assert_close(y.detach(), reward.score(None, x.detach()).scores, atol=2e-3, rtol=0)
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # directional finite difference agrees with the gradient
    d = torch.randn_like(x) * 1e-3
    with torch.no_grad():
        plus = reward.score(None, (x + d).clamp(0, 1).requires_grad_(True)).scores.sum()
        minus = reward.score(None, (x - d).clamp(0, 1).requires_grad_(True)).scores.sum()
    fd = float(plus - minus) / 2
    assert fd == pytest.approx(float((x.grad * d).sum()), rel=0.05, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# UnivFD
# ----------------------------------------------------------------------------------------------
def univfd_reference(clip_dir, fc_path, images, resize=False):
    """UnivFD's validate.py transform and CLIPModel.forward: CenterCrop(224) on the PIL image, ToTensor,
    CLIP Normalize, encode_image, fc, sigmoid = P(fake)."""
    from torchvision import transforms
    from transformers import CLIPModel

    steps = [transforms.Resize(224, interpolation=transforms.InterpolationMode.BICUBIC)] if resize else []
    tf = transforms.Compose([
        *steps,
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]),
    ])  # fmt: skip
    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    sd = torch.load(fc_path, map_location="cpu")
    fc = torch.nn.Linear(sd["weight"].shape[1], sd["weight"].shape[0])
    fc.load_state_dict(sd)
    with torch.no_grad():
        batch = torch.stack([tf(to_pil(x)) for x in images])
        feats = model.get_image_features(pixel_values=batch)
        feats = feats if isinstance(feats, torch.Tensor) else feats.pooler_output
        return fc(feats)


@pytest.mark.parity
def test_univfd_equals_validate_recipe(tmp_path):
    clip_dir, fc_path = save_tiny_univfd(tmp_path)
    reward = mmreward.load("univfd", checkpoint=fc_path, backbone=clip_dir)
    images = quantized_images([(256, 300), (256, 300), (100, 180)])  # larger and smaller than the 224 crop
    logits = univfd_reference(clip_dir, fc_path, images)
    out = reward.score(None, images)
    record_parity("univfd", original=UNIVFD, how="transcribed", actual=out.scores,
                  expected=1 - torch.sigmoid(logits[:, 0]), cases=("RGB", "odd size"),
                  not_checked="the CLIP tower is transformers' CLIPModel, not the openai clip package the original loads")
    torch.testing.assert_close(out.scores, 1 - torch.sigmoid(logits[:, 0]), atol=1e-5, rtol=0)
    assert out.scores.std() > 1e-5
    # the folder holding fc_weights.pth works as the checkpoint too; crop="clip" resizes the shorter side first
    clip_crop = mmreward.load("univfd", checkpoint=tmp_path, backbone=clip_dir, crop="clip")
    resized = univfd_reference(clip_dir, fc_path, images, resize=True)
    torch.testing.assert_close(
        clip_crop.score(None, images).scores, 1 - torch.sigmoid(resized[:, 0]), atol=1e-5, rtol=0
    )


def test_univfd_two_output_head_and_gradients(tmp_path):
    clip_dir, fc_path = save_tiny_univfd(tmp_path, fc_outputs=2)
    images = quantized_images([(224, 224)] * 3, seed=3)
    logits = univfd_reference(clip_dir, fc_path, images)
    for real_index in (0, 1):
        reward = mmreward.load("univfd", checkpoint=fc_path, backbone=clip_dir, real_index=real_index)
        torch.testing.assert_close(
            reward.score(None, images).scores, torch.softmax(logits, -1)[:, real_index], atol=1e-5, rtol=0
        )
    x = torch.stack(images).requires_grad_(True)
    y = reward.score(None, x).scores
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    torch.testing.assert_close(y.detach(), torch.softmax(logits, -1)[:, 1], atol=1e-5, rtol=0)


def test_univfd_weight_file_errors(tmp_path):
    clip_dir, fc_path = save_tiny_univfd(tmp_path)
    sd = torch.load(fc_path)
    torch.save({"fc." + k: v for k, v in sd.items()} | {"model.visual.proj": torch.zeros(1)}, tmp_path / "full.pth")
    full = mmreward.load("univfd", checkpoint=tmp_path / "full.pth", backbone=clip_dir)  # a whole-model state dict
    images = quantized_images([(224, 224)] * 2, seed=4)
    torch.testing.assert_close(
        full.score(None, images).scores,
        1 - torch.sigmoid(univfd_reference(clip_dir, fc_path, images)[:, 0]),
        atol=1e-5,
        rtol=0,
    )
    torch.save({"weight": torch.zeros(1, 768), "bias": torch.zeros(1)}, tmp_path / "vitl.pth")
    with pytest.raises(CheckpointError, match="768-dim"):
        mmreward.load("univfd", checkpoint=tmp_path / "vitl.pth", backbone=clip_dir)
    torch.save({"linear.weight": torch.zeros(1, 16)}, tmp_path / "odd.pth")
    with pytest.raises(CheckpointError, match="linear probe"):
        mmreward.load("univfd", checkpoint=tmp_path / "odd.pth", backbone=clip_dir)
    with pytest.raises(CheckpointError):
        mmreward.load("univfd", checkpoint=tmp_path / "nowhere" / "fc_weights.pth", backbone=clip_dir)
    with pytest.raises(CheckpointError, match="no default checkpoint"):
        mmreward.load("univfd", backbone=clip_dir)
    with pytest.raises(ConfigError, match="crop must be"):
        mmreward.load("univfd", checkpoint=fc_path, backbone=clip_dir, crop="resize")


# ----------------------------------------------------------------------------------------------
# RealGen: weighted detectors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parity
def test_realgen_weighted_sum_of_detectors(tmp_path):
    save_tiny_image_classifier(tmp_path / "vit")
    clip_dir, fc_path = save_tiny_univfd(tmp_path / "univfd")
    detectors = {
        "vit": {"reward": "realism-classifier", "checkpoint": str(tmp_path / "vit"), "weight": 1.0},
        "clip": {"reward": "univfd", "checkpoint": str(fc_path), "weight": 0.5, "options": {"backbone": str(clip_dir)}},
    }
    ensemble = mmreward.load("realgen-detectors", detectors=detectors)
    images = torch.stack(quantized_images([(224, 240)] * 3, seed=5))
    out = ensemble.score(None, images)
    p_vit = mmreward.load("realism-classifier", checkpoint=tmp_path / "vit").score(None, images).scores
    p_clip = mmreward.load("univfd", checkpoint=fc_path, backbone=clip_dir).score(None, images).scores
    torch.testing.assert_close(out.scores, p_vit + 0.5 * p_clip, atol=1e-6, rtol=0)
    # and against the detectors' originals directly: transformers' pipeline and UnivFD's validate recipe
    import transformers

    want = (pipeline_p_real(tmp_path / "vit", list(images), "real")
            + 0.5 * (1 - torch.sigmoid(univfd_reference(clip_dir, fc_path, list(images))[:, 0])))
    record_parity("realgen-detectors", original=f"weighted sum of transformers=={transformers.__version__} pipeline "
                  f"and {UNIVFD}", how="package, transcribed", actual=out.scores, expected=want, cases=("RGB",),
                  not_checked="the sum is checked with tiny stand-in detectors; RealGen's own detector weights are not")
    torch.testing.assert_close(out.scores, want, atol=2e-5, rtol=0)
    torch.testing.assert_close(out.details["vit"], p_vit)
    torch.testing.assert_close(out.details["clip"], p_clip)
    assert ensemble.name == "realgen-detectors" and ensemble.differentiable
    x = images.clone().requires_grad_(True)
    ensemble.score(None, x).scores.sum().backward()
    assert x.grad.abs().sum() > 0

    with pytest.raises(ConfigError, match="at least one detector"):
        mmreward.load("realgen-detectors", detectors={})
    with pytest.raises(ConfigError, match="unknown keys"):
        mmreward.load("realgen-detectors", detectors={"a": {"reward": "univfd", "weights": 2.0}})
    with pytest.raises(ConfigError, match="a dict with a 'reward'"):
        mmreward.load("realgen-detectors", detectors={"a": "univfd"})
    with pytest.raises(ConfigError, match="not a higher-is-better"):
        mmreward.load("realgen-detectors", detectors={"a": _LowerIsBetter()})


class _LowerIsBetter(mmreward.Reward):
    higher_is_better = False
    requires_prompt = False

    def _score(self, prompts, media):
        return mmreward.RewardOutput(torch.zeros(len(media)))


def test_univfd_on_an_open_clip_backbone(tmp_path):
    import open_clip
    from torchvision import transforms

    model_cfg = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16, "patch_size": 32},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    torch.manual_seed(0)
    clip = open_clip.model.CLIP(**model_cfg).eval()
    torch.save(clip.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    fc = torch.nn.Linear(16, 1)
    torch.save(fc.state_dict(), tmp_path / "fc_weights.pth")
    reward = mmreward.load(
        "univfd", checkpoint=tmp_path / "fc_weights.pth", backbone=tmp_path / "open_clip_pytorch_model.bin",
        backbone_format="open_clip", backbone_config=model_cfg,
    )  # fmt: skip
    images = quantized_images([(230, 260), (230, 260), (200, 240)], seed=6)
    tf = transforms.Compose([
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD),
    ])  # fmt: skip
    with torch.no_grad():
        expected = 1 - torch.sigmoid(fc(clip.encode_image(torch.stack([tf(to_pil(x)) for x in images])))[:, 0])
    torch.testing.assert_close(reward.score(None, images).scores, expected, atol=1e-5, rtol=0)
