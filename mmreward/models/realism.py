"""Realism rewards from synthetic-image detectors: reward = P(real), as RealGen's detector reward.

- "realism-classifier": any transformers `AutoModelForImageClassification` detector (e.g. a ViT, Swin or
  ConvNeXt fine-tuned on real vs generated images). Which class means "real" is read from
  config.id2label (`_real_fake_labels`) or given as `real_label=` / `fake_label=`. The head's activation
  is the transformers pipeline's: softmax, or sigmoid for single-logit and multi-label heads. Pixels go
  through the checkpoint's own image processor: on uint8 images when scoring (exactly what the
  pipeline computes from an image file), on the float tensors themselves when they require grad.
- "univfd": the UnivFD linear probe (Ojha et al. 2023; OmniAID and RealGen build on its CLIP
  features): CLIP ViT-L/14 projected image embedding (OpenAI CLIP `encode_image`) -> `fc`
  (UnivFD's `fc_weights.pth`, {'weight': (1, 768), 'bias': (1,)}); sigmoid(fc) = P(fake). UnivFD
  evaluates a centre crop of 224 px without resizing (zero-padded when smaller) and CLIP mean/std;
  `crop="clip"` resizes the shorter side first (CLIP's own eval recipe) for large generated images.
  A two-output head (softmax, `real_index`, 0 in OmniAID's convention) is accepted too.
- "realgen-detectors": RealGen's combination, sum_i w_i * P_i(real) over several detectors
  (RealGen trains with equal weights 1.0 on a semantic-level and a feature-level detector).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any, Literal

import torch

from mmreward import media as media_io
from mmreward import preprocess as T
from mmreward.compose import WeightedSum
from mmreward.errors import CheckpointError, ConfigError
from mmreward.models.real_fake_labels import RealOutput, resolve_real_output
from mmreward.types import Reward, RewardOutput

UNIVFD_FC_FILE = "fc_weights.pth"
UNIVFD_BACKBONE = "openai/clip-vit-large-patch14"


def _p_real(logits: torch.Tensor, real: RealOutput, sigmoid: bool) -> torch.Tensor:
    logits = logits.float()
    if sigmoid:
        # sigmoid(-x) = 1 - sigmoid(x) without cancellation when the detector is sure of "fake"
        x = logits[:, real.index]
        return torch.sigmoid(-x if real.negate else x)
    p = torch.softmax(logits, dim=-1)[:, real.index]
    return 1.0 - p if real.negate else p


# ----------------------------------------------------------------------------------------------
# transformers image-classification detectors
# ----------------------------------------------------------------------------------------------
class ImageClassifierRealism(Reward):
    name = "realism-classifier"
    differentiable = True
    requires_prompt = False

    def __init__(self, model: torch.nn.Module, processor, real: RealOutput, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model, self.processor, self.real = model, processor, real
        cfg = model.config
        self.sigmoid = cfg.num_labels == 1 or getattr(cfg, "problem_type", None) == "multi_label_classification"

    def pixels(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if media_io.requires_grad(media):
            batch = media if isinstance(media, torch.Tensor) else list(media)
            inputs = self.processor(images=batch, do_rescale=False, return_tensors="pt")
        else:  # the pixels an image file would hold, so scores equal the transformers pipeline's on that file
            def to_uint8(t: torch.Tensor) -> torch.Tensor:
                return (t.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()

            uint8 = to_uint8(media) if isinstance(media, torch.Tensor) else [to_uint8(t) for t in media]
            inputs = self.processor(images=uint8, return_tensors="pt")
        return inputs["pixel_values"].to(device=self.device, dtype=self.dtype)

    def _score(self, prompts: list[str], media) -> RewardOutput:
        logits = self.model(pixel_values=self.pixels(media)).logits
        p = _p_real(logits, self.real, self.sigmoid)
        return RewardOutput(p, {"p_fake": 1.0 - p})


def load_realism_classifier(
    checkpoint: str | os.PathLike | None = None,
    *,
    weights: str = "pretrained",
    real_label: int | str | None = None,
    fake_label: int | str | None = None,
    arch: Literal["vit", "convnext"] = "vit",
    **options: Any,
) -> ImageClassifierRealism:
    """From a hub id or a save_pretrained folder; weights="random" writes a tiny `arch` detector first."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    if weights == "random" and checkpoint is None:
        from mmreward.models.realism_random import save_tiny_image_classifier

        checkpoint = save_tiny_image_classifier(tempfile.mkdtemp(prefix="mmreward_tiny_detector_"), arch=arch)
    if checkpoint is None:
        raise CheckpointError(
            "realism-classifier has no default checkpoint: pass checkpoint='<hub id or folder>' of an image "
            "classification detector (config.json with id2label, model weights, preprocessor_config.json)"
        )
    source = os.fspath(checkpoint)
    source = source[len("hf-hub:") :] if source.startswith("hf-hub:") else source
    try:
        if weights == "random":
            from transformers import AutoConfig

            model = AutoModelForImageClassification.from_config(AutoConfig.from_pretrained(source))
        else:
            from mmreward.checkpoints import load_pretrained

            model = load_pretrained(AutoModelForImageClassification, source)
        processor = AutoImageProcessor.from_pretrained(source)
    except OSError as exc:
        raise CheckpointError(
            f"cannot load the image-classification detector '{source}': {exc}. Offline, pass a local folder saved "
            "with save_pretrained (model and image processor), or cache the hub repo first."
        ) from exc
    real = resolve_real_output(model.config.id2label, real_label=real_label, fake_label=fake_label)
    return ImageClassifierRealism(model.float().eval(), processor, real, **options)


# ----------------------------------------------------------------------------------------------
# UnivFD: linear probe on CLIP image features
# ----------------------------------------------------------------------------------------------
class CLIPProbeRealism(Reward):
    name = "univfd"
    differentiable = True
    requires_prompt = False
    # Precision: the CLIP tower may run in bf16; the linear probe and its sigmoid/softmax run in fp32,
    # since the probe's logit is the score before a squashing that flattens bf16 steps unevenly.
    keep_fp32 = ("fc",)

    def __init__(
        self,
        backbone,
        fc: torch.nn.Linear,
        *,
        crop_size: int = 224,
        crop: Literal["univfd", "clip"] = "univfd",
        real_index: int = 0,
        **kwargs: Any,
    ) -> None:
        from mmreward.preprocess import ImagePreprocess

        super().__init__(**kwargs)
        if crop not in ("univfd", "clip"):
            raise ConfigError(f"crop must be 'univfd' (centre crop, no resize) or 'clip' (resize, then crop), got {crop!r}")
        if fc.out_features not in (1, 2):
            raise ConfigError(f"the probe must have 1 (sigmoid = P(fake)) or 2 (softmax) outputs, got {fc.out_features}")
        if fc.out_features == 2 and real_index not in (0, 1):
            raise ConfigError(f"real_index must be 0 or 1 for a two-output probe, got {real_index}")
        self.backbone, self.fc = backbone, fc
        self.crop_size, self.crop, self.real_index = crop_size, crop, real_index
        self._clip_preprocess = ImagePreprocess(size=crop_size, crop=crop_size, crop_rounding="round")

    def pixels(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if self.crop == "clip":
            return self._clip_preprocess(media)
        # torchvision CenterCrop on the full-resolution image, then ToTensor + Normalize (UnivFD's validate.py)
        images = media.float() if isinstance(media, torch.Tensor) else [t.float() for t in media]
        return T.normalize(T.center_crop(images, self.crop_size, "round"), T.OPENAI_CLIP_MEAN, T.OPENAI_CLIP_STD)

    def features(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """Projected CLIP image embeddings (B, D): OpenAI CLIP's `encode_image`, not normalised."""
        p = next(self.backbone.parameters())
        return self.backbone.encode_pixels(self.pixels(media).to(device=p.device, dtype=p.dtype))

    def _score(self, prompts: list[str], media) -> RewardOutput:
        logits = self.fc(self.features(media).to(self.fc.weight.dtype)).float()
        if logits.shape[1] == 1:
            p = torch.sigmoid(-logits[:, 0])  # UnivFD's sigmoid is P(fake)
        else:
            p = torch.softmax(logits, dim=-1)[:, self.real_index]
        return RewardOutput(p, {"p_fake": 1.0 - p})


def _load_fc(path, dim: int) -> torch.nn.Linear:
    from mmreward.checkpoints import load_state_dict, load_strict

    sd = load_state_dict(path)
    # a whole UnivFD model state dict holds the probe under "fc."
    if "fc.weight" in sd:
        sd = {k[len("fc.") :]: v for k, v in sd.items() if k.startswith("fc.")}
    weight = sd.get("weight")
    is_matrix = isinstance(weight, torch.Tensor) and weight.ndim == 2
    if is_matrix and weight.shape[1] != dim:
        raise CheckpointError(
            f"{path}: the probe expects {weight.shape[1]}-dim CLIP features but the backbone gives {dim} "
            "(UnivFD's fc_weights.pth is for CLIP ViT-L/14, 768-dim); pass the matching backbone="
        )
    fc = torch.nn.Linear(dim, weight.shape[0] if is_matrix else 1)
    # strict: names every missing, extra or mis-shaped key of the probe {'weight': (1, D), 'bias': (1,)}
    load_strict(fc, sd, f"{path} (UnivFD's linear probe)")
    return fc


def load_univfd(
    checkpoint: str | os.PathLike | None = None,
    *,
    weights: str = "pretrained",
    backbone: str | os.PathLike | None = None,
    backbone_format: Literal["hf", "open_clip"] = "hf",
    backbone_model_name: str | None = None,
    backbone_config: dict | None = None,
    crop: Literal["univfd", "clip"] = "univfd",
    crop_size: int | None = None,
    real_index: int = 0,
    **options: Any,
) -> CLIPProbeRealism:
    """checkpoint: UnivFD's fc_weights.pth (or a folder holding it); backbone: the CLIP ViT-L/14 it probes,
    a transformers CLIPModel hub id/folder (default openai/clip-vit-large-patch14), or with
    backbone_format="open_clip" an open_clip hub-layout folder, or a weights file plus
    backbone_model_name="ViT-L-14". backbone_config: a CLIPConfig dict (hf) or an open_clip model_cfg."""
    from mmreward.backbones.clip import (
        HFClipBackbone,
        build_open_clip_backbone,
        load_hf_clip_model,
    )
    from mmreward.checkpoints import resolve_files
    from mmreward.preprocess import ImagePreprocess

    if backbone_format not in ("hf", "open_clip"):
        raise ConfigError(f"backbone_format must be 'hf' or 'open_clip', got {backbone_format!r}")
    if weights == "random" and backbone is None and backbone_config is None and backbone_format == "hf":
        from mmreward.models.realism_random import UNIVFD_RANDOM_BACKBONE

        backbone_config = UNIVFD_RANDOM_BACKBONE
    if weights == "pretrained" and checkpoint is None:
        raise CheckpointError(
            f"univfd needs the probe weights: pass checkpoint='<path to UnivFD's {UNIVFD_FC_FILE}>' "
            "(from the UniversalFakeDetect repository's pretrained_weights/)"
        )
    if backbone_format == "hf":
        source = None if backbone is None and backbone_config is not None else os.fspath(backbone or UNIVFD_BACKBONE)
        model = load_hf_clip_model(source, weights=weights, config=backbone_config)
        clip = HFClipBackbone(model, None, ImagePreprocess())
        dim, size = int(model.config.projection_dim), int(model.config.vision_config.image_size)
    else:
        clip = build_open_clip_backbone(
            None if backbone is None else os.fspath(backbone),
            weights=weights,
            model_name=backbone_model_name,
            model_cfg=backbone_config,
        )
        dim = int(clip.model.visual.output_dim)
        size = clip.preprocess.crop
    if weights == "random":
        fc = torch.nn.Linear(dim, 1)
    else:
        path = resolve_files(os.fspath(checkpoint), [UNIVFD_FC_FILE])[UNIVFD_FC_FILE]
        fc = _load_fc(path, dim)
    return CLIPProbeRealism(clip, fc, crop_size=crop_size or size, crop=crop, real_index=real_index, **options)


# ----------------------------------------------------------------------------------------------
# RealGen: several detectors, weighted
# ----------------------------------------------------------------------------------------------
class DetectorEnsemble(WeightedSum):
    """sum_i w_i * P_i(real); `details` holds each detector's P(real)."""

    name = "realgen-detectors"


def load_realgen_detectors(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    detectors: Mapping[str, Mapping[str, Any] | Reward] | None = None,
    **options: Any,
) -> DetectorEnsemble:
    """detectors: {name: Reward, or {"reward": registered name, "checkpoint": ..., "weight": 1.0, "options": {...}}}."""
    from mmreward.registry import load

    if checkpoint is not None:
        raise ConfigError("realgen-detectors takes no checkpoint: give each detector its own in detectors={...}")
    if not detectors:
        raise ConfigError(
            "detectors: name at least one detector, e.g. {'clip': {'reward': 'univfd', 'checkpoint': 'fc_weights.pth'}, "
            "'vit': {'reward': 'realism-classifier', 'checkpoint': '<hub id>', 'weight': 1.0}}"
        )
    built, weights_by_name = {}, {}
    for key, entry in detectors.items():
        if isinstance(entry, Reward):
            built[key], weights_by_name[key] = entry, 1.0
            continue
        if not isinstance(entry, Mapping) or "reward" not in entry:
            raise ConfigError(f"detectors[{key!r}]: expected a Reward or a dict with a 'reward' name, got {entry!r}")
        unknown = set(entry) - {"reward", "checkpoint", "weight", "options"}
        if unknown:
            raise ConfigError(f"detectors[{key!r}]: unknown keys {sorted(unknown)}; use reward, checkpoint, weight, options")
        built[key] = load(entry["reward"], checkpoint=entry.get("checkpoint"), weights=weights, **entry.get("options", {}))
        weights_by_name[key] = float(entry.get("weight", 1.0))
    for key, reward in built.items():
        if not reward.higher_is_better:
            raise ConfigError(f"detectors[{key!r}]: '{reward.name}' is not a higher-is-better P(real) reward")
    return DetectorEnsemble(built, weights_by_name, **options)
