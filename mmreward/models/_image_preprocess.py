"""The reference image preprocessing of the CLIP/BLIP-family rewards, as one configurable card.

Two recipes cover every family in the zoo:
- "shortest-crop": resize the shorter side to `size` (bicubic, longer side truncated), then centre-crop
  `crop` x `crop` (torchvision rounds the offset, Hugging Face processors floor it);
- "longest-pad": resize the longer side to `size` (shorter side rounded) and zero-pad centred to a square
  (open_clip's ResizeMaxSize, used by HPSv2 on tensors after ToTensor).

Paths: the scoring path reproduces the reference bit for bit (Pillow resize on uint8 for the
"pil" resize backend); the differentiable path (media that requires grad) uses the same geometry with
`F.interpolate(bicubic, antialias=True)` on floats, which is differentiable and deviates from Pillow by
quantisation and fixed-point rounding only.

Alpha: the references disagree on where an RGBA image loses its alpha, and for transparent images
that moves scores by a large part of their spread, so the card says which the family's original does
(`ALPHA_CONVENTIONS`). The media layer hands 4-channel images to cards that use alpha (see
`Reward.image_alpha`); 4-channel input to a "drop_first" card is reduced to RGB first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from mmreward import transforms as T
from mmreward.errors import ConfigError, RewardInputError
from mmreward.pil_resize import pil_resize

ALPHA_CONVENTIONS = {
    "drop_first": "alpha dropped before resizing (PIL convert('RGB') first: Hugging Face processors up to "
    "transformers 4.x)",
    "resize_then_drop": "the RGBA image is resized (Pillow: premultiplied by alpha, so transparent pixels come "
    "out dark) and cropped, then alpha is dropped (OpenAI CLIP's and open_clip's preprocess, ImageReward)",
    "composite:<colour>": "alpha-composited onto a background colour (white, black or #rrggbb) first",
    "reject": "images with any transparency are an error",
}
_NAMED_COLOURS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


def parse_alpha(alpha: str) -> tuple[str, tuple[float, float, float] | None]:
    """'composite:white' -> ('composite', (1, 1, 1)); other conventions -> (alpha, None)."""
    if alpha in ("drop_first", "resize_then_drop", "reject"):
        return alpha, None
    if isinstance(alpha, str) and alpha.startswith("composite:"):
        colour = alpha.split(":", 1)[1].strip().lower()
        if colour in _NAMED_COLOURS:
            return "composite", _NAMED_COLOURS[colour]
        if len(colour) == 7 and colour[0] == "#":
            try:
                return "composite", tuple(int(colour[i : i + 2], 16) / 255.0 for i in (1, 3, 5))  # type: ignore[return-value]
            except ValueError:
                pass
    raise ConfigError(
        f"alpha must be one of 'drop_first', 'resize_then_drop', 'reject' or 'composite:<white|black|#rrggbb>', "
        f"got {alpha!r}"
    )


@dataclass(frozen=True)
class ImagePreprocess:
    size: int = 224
    crop: int = 224
    mode: Literal["shortest-crop", "longest-pad"] = "shortest-crop"
    crop_rounding: Literal["round", "floor"] = "round"
    resize_backend: Literal["pil", "torch"] = "pil"
    mean: tuple[float, float, float] = T.OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = T.OPENAI_CLIP_STD
    alpha: str = "drop_first"

    def __post_init__(self) -> None:
        parse_alpha(self.alpha)
        if self.size < 1 or self.crop < 1:
            raise ConfigError(f"size and crop must be >= 1, got size={self.size}, crop={self.crop}")
        if self.mode not in ("shortest-crop", "longest-pad"):
            raise ConfigError(f"mode must be 'shortest-crop' or 'longest-pad', got {self.mode!r}")
        if self.crop_rounding not in ("round", "floor"):
            raise ConfigError(f"crop_rounding must be 'round' or 'floor', got {self.crop_rounding!r}")
        if self.resize_backend not in ("pil", "torch"):
            raise ConfigError(f"resize_backend must be 'pil' or 'torch', got {self.resize_backend!r}")

    def describe(self) -> str:
        if self.mode == "longest-pad":
            geo = f"resize longer side to {self.size} (bicubic, antialiased, on float tensors), zero-pad to square"
        else:
            geo = (
                f"resize shorter side to {self.size} (bicubic; Pillow on uint8 when scoring), "
                f"centre-crop {self.crop} (offset {self.crop_rounding}ed)"
            )
        return f"{geo}; alpha {self.alpha}; normalise mean={self.mean} std={self.std}"

    def _alpha_first(self, x: torch.Tensor) -> torch.Tensor:
        """(C, H, W) or (B, C, H, W) -> what the geometry gets: RGB, or RGBA for resize_then_drop."""
        if x.shape[-3] != 4:
            return x
        kind, colour = parse_alpha(self.alpha)
        if kind == "resize_then_drop":
            return x
        rgb, a = x[..., :3, :, :], x[..., 3:4, :, :]
        if kind == "reject":
            with torch.no_grad():
                lowest = float(a.min())
            if lowest < 1.0:
                raise RewardInputError(
                    f"this reward's original cannot score transparent images (alpha down to {lowest:.3g}); "
                    "composite them onto a background first, e.g. media.load_image(img, alpha='white')"
                )
            return rgb
        if kind == "composite":
            bg = torch.as_tensor(colour, dtype=x.dtype, device=x.device).view(3, 1, 1)
            return rgb * a + bg * (1 - a)
        return rgb

    def __call__(self, images: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """(B, C, H, W) or a list of (C, H, W) in [0, 1], C = 3 or 4 (RGBA) -> normalised (B, 3, crop, crop)
        float32 pixels. Alpha is handled as `self.alpha` says."""
        wants_grad = images.requires_grad if isinstance(images, torch.Tensor) else any(t.requires_grad for t in images)
        if isinstance(images, torch.Tensor):
            images = self._alpha_first(images.float())
        else:
            images = [self._alpha_first(t.float()) for t in images]
        # RGBA items keep alpha through resize (premultiplied) and crop/pad, then drop it: the reference
        # converts to RGB after its geometric transforms. Dropping per group lets RGB and RGBA items stack.
        if self.mode == "longest-pad":
            # the reference itself resizes float tensors, so both paths are the same computation
            x = T.map_groups(lambda g: T.resize_longest_and_pad(g, self.size, "bicubic", antialias=True)[:, :3], images)
        elif wants_grad or self.resize_backend == "torch":
            # resize and crop each same-size group together: resized groups differ in size until cropped
            x = T.map_groups(
                lambda g: T.center_crop(
                    T.resize(g, self.size, "bicubic", antialias=True), self.crop, self.crop_rounding
                )[:, :3],
                images,
            )
        else:
            resized = pil_resize(images, lambda h, w: T.output_size_shorter_side(h, w, self.size))
            x = T.center_crop([t[:3] for t in resized], self.crop, self.crop_rounding)
        return T.normalize(x, self.mean, self.std)
