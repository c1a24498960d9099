"""GenEval's colour classifier: CLIP zero-shot on each object's masked crop over a #999 background.

As djghosh13/geneval@af4902f `evaluation/evaluate_images.py` (`ImageCrops`, `color_classification`) and
yifan123/reward-server@92ac29f `reward_server/gen_eval.py`: the image (8-bit RGB) is composited over
a flat #999 (153, 153, 153) image through the object's mask (whole image when the detector gives no
mask), cropped to the box (Pillow rounds the coordinates; area outside the image is black), and put
through the CLIP's eval transform. Class vectors follow clip_benchmark's `zero_shot_classifier`: per
colour, the three templates' text embeddings L2-normalised, averaged and normalised again; the
colour is the argmax of image-embedding x class vector. The originals use open_clip ViT-L-14
`pretrained="openai"` under fp16 autocast; here the CLIP runs in the reward's dtype (fp32 by default).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError, RewardInputError
from mmreward.geneval import Detection

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
# `{c}` is the colour, `{name}` the object class
TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")
BACKGROUND = (153, 153, 153)  # "#999"
# open_clip's hub layout of OpenAI's ViT-L/14 (the weights GenEval's `pretrained="openai"` loads)
DEFAULT_CHECKPOINT = "hf-hub:timm/vit_large_patch14_clip_224.openai"


def to_uint8_hwc(image: torch.Tensor) -> np.ndarray:
    """(3, H, W) in [0, 1] -> (H, W, 3) uint8, rounding as an 8-bit image file would store it."""
    return (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def masked_crops(pixels: np.ndarray, objects: Sequence[Detection], background: tuple[int, int, int] = BACKGROUND) -> list:
    """GenEval's crops as Pillow images: the object's mask over `background`, cut to its box."""
    from PIL import Image

    h, w = pixels.shape[:2]
    crops = []
    for d in objects:
        if d.mask is not None:
            mask = np.asarray(d.mask.detach().cpu() if isinstance(d.mask, torch.Tensor) else d.mask).astype(bool)
            if mask.shape != (h, w):
                raise RewardInputError(f"detection mask has shape {mask.shape}, the image is {(h, w)}")
            canvas = np.where(mask[..., None], pixels, np.asarray(background, dtype=np.uint8))
        else:
            canvas = pixels
        crops.append(Image.fromarray(np.ascontiguousarray(canvas)).crop(tuple(d.box)))
    return crops


class ClipColorClassifier(torch.nn.Module):
    """Names object colours with a CLIP backbone (`mmreward.backbones.clip`, open_clip or transformers)."""

    def __init__(
        self,
        backbone: torch.nn.Module,
        colors: Sequence[str] = GENEVAL_COLORS,
        templates: Sequence[str] = TEMPLATES,
        background: tuple[int, int, int] = BACKGROUND,
    ) -> None:
        super().__init__()
        if not colors or not templates:
            raise ConfigError("the CLIP colour classifier needs at least one colour and one template")
        self.backbone = backbone
        self.colors, self.templates, self.background = tuple(colors), tuple(templates), tuple(background)

    @torch.no_grad()
    def class_vectors(self, name: str) -> torch.Tensor:
        """(D, len(colors)): per colour, the normalised mean of its normalised template embeddings."""
        texts = [t.format(c=c, name=name) for c in self.colors for t in self.templates]
        emb = F.normalize(self.backbone.text_features(texts).float(), dim=-1)
        per_color = emb.view(len(self.colors), len(self.templates), -1).mean(dim=1)
        return F.normalize(per_color, dim=-1).T

    @torch.no_grad()
    def logits(self, image: torch.Tensor, objects: Sequence[Detection], name: str) -> torch.Tensor:
        """(len(objects), len(colors)) zero-shot logits, 100 x cosine, for one (3, H, W) image in [0, 1]."""
        crops = masked_crops(to_uint8_hwc(image), objects, self.background)
        tensors = [torch.from_numpy(np.array(c)).permute(2, 0, 1).float() / 255 for c in crops]
        feats = F.normalize(self.backbone.image_features(tensors).float(), dim=-1)
        return 100.0 * feats @ self.class_vectors(name).to(feats.device)

    def classify(self, image: torch.Tensor, objects: Sequence[Detection], name: str) -> list[str]:
        """The colour of each object of class `name` in one (3, H, W) image in [0, 1]."""
        if not objects:
            return []
        return [self.colors[int(i)] for i in self.logits(image, objects, name).argmax(dim=1)]


def load_clip_colors(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    backbone: str = "auto",
    model_name: str | None = None,
    config: dict | None = None,
    seed: int | None = None,
) -> ClipColorClassifier:
    """A CLIP colour classifier from an open_clip hub-layout folder/repo (the default: OpenAI ViT-L/14),
    an open_clip weights file with `model_name`, or a transformers CLIPModel folder/repo.
    weights="random" builds transformers' CLIP from `config` (tests, tiny rewards)."""
    from mmreward.backbones import clip as cb

    if weights == "random":
        if config is None:
            from mmreward.catalog import TINY_CLIP_CONFIG as config
        return ClipColorClassifier(cb.build_hf_backbone(None, weights="random", config=config, seed=seed))
    checkpoint = checkpoint or DEFAULT_CHECKPOINT
    if backbone == "auto":
        backbone = "open_clip" if model_name or cb.has_files(checkpoint, (cb.OPEN_CLIP_CONFIG,)) else "transformers"
    if backbone == "open_clip":
        net = cb.build_open_clip_backbone(checkpoint, weights=weights, model_name=model_name)
    elif backbone == "transformers":
        net = cb.build_hf_backbone(checkpoint, weights=weights)
    else:
        raise ConfigError(f"colour backbone: expected 'auto', 'open_clip' or 'transformers', got {backbone!r}")
    return ClipColorClassifier(net.eval())


class LazyClipColors(torch.nn.Module):
    """Loads the CLIP colour classifier at the first colour clause: prompts without colours never need the
    ViT-L/14 weights. A missing checkpoint is still an error, raised then. Device/dtype moves of the reward
    are kept on an empty anchor buffer and applied to the classifier when it loads."""

    def __init__(self, checkpoint: str | None, weights: str, options: dict) -> None:
        super().__init__()
        self.checkpoint, self.weights, self.options = checkpoint, weights, dict(options)
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)
        self.inner: ClipColorClassifier | None = None

    def loaded(self) -> ClipColorClassifier:
        if self.inner is None:
            self.inner = load_clip_colors(self.checkpoint, weights=self.weights, **self.options).to(
                device=self._anchor.device, dtype=self._anchor.dtype
            )
        return self.inner

    def classify(self, image: torch.Tensor, objects: Sequence[Detection], name: str) -> list[str]:
        return self.loaded().classify(image, objects, name) if objects else []
