"""Independent per-image reference pipelines for the image reward zoo tests (PIL + torchvision/HF).

Nothing here imports mmreward's preprocessing: these are the reference packages' recipes written out
plainly, applied one PIL image at a time, as the reference packages do.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torchvision import transforms as tvt

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def smooth_image(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    """Uint8 HWC image: smooth colour field plus noise (so real networks give distinct outputs)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(1, channels, 5, 5, generator=g)
    img = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)[0]
    img = (img + 0.15 * torch.rand(channels, h, w, generator=g)).clamp(0, 1)
    return (img.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def gradient_alpha_image(h: int, w: int, seed: int) -> Image.Image:
    """RGBA: a colourful image whose alpha runs from 0 (left column) to 255 (right column)."""
    rgba = np.concatenate([smooth_image(h, w, seed), np.zeros((h, w, 1), np.uint8)], axis=-1)
    rgba[..., 3] = np.linspace(0, 255, w).round().astype(np.uint8)[None, :]
    return Image.fromarray(rgba, "RGBA")


# what as_inputs(mixed_pil_images()) covers, for the parity table
ZOO_CASES = ("RGB", "grayscale", "odd sizes (333x517, 300x301)", "RGBA (alpha 0-255)", "uint8/float/numpy tensors")


def mixed_pil_images() -> list[Image.Image]:
    """Odd sizes, RGBA with alpha from 0 to 255, grayscale, portrait and landscape."""
    return [
        Image.fromarray(smooth_image(333, 517, 1)),
        gradient_alpha_image(517, 333, 2),
        Image.fromarray(smooth_image(300, 301, 3, channels=1)[..., 0]),
        Image.fromarray(smooth_image(250, 250, 4)),
    ]


def torchvision_clip_transform(size: int = 224) -> tvt.Compose:
    """OpenAI CLIP's `_transform` (also ImageReward's) on PIL images: crop offset rounded, and RGB
    conversion AFTER resize and crop, so Pillow resizes RGBA images in premultiplied form."""
    return tvt.Compose([
        tvt.Resize(size, interpolation=tvt.InterpolationMode.BICUBIC),
        tvt.CenterCrop(size),
        lambda im: im.convert("RGB"),
        tvt.ToTensor(),
        tvt.Normalize(OPENAI_MEAN, OPENAI_STD),
    ])


def hf_clip_pixels(images: list[Image.Image], size: int = 224) -> list[torch.Tensor]:
    """The PIL CLIPImageProcessor (PickScore's / torchmetrics' processor): crop offset floored.

    RGB conversion comes first, as in the processor PickScore pins (transformers 4.27.3), whose
    `convert_to_rgb` is PIL's `convert("RGB")`: alpha dropped. transformers 5 composites transparency
    onto white instead, so the installed processor gets the image already converted the pinned way."""
    from transformers.models.clip import CLIPImageProcessorPil

    proc = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return [proc(images=pinned_convert_to_rgb(im), return_tensors="pt")["pixel_values"] for im in images]


def pinned_convert_to_rgb(im: Image.Image) -> Image.Image:
    """transformers 4.x `image_transforms.convert_to_rgb` (PIL images only)."""
    return im if im.mode == "RGB" else im.convert("RGB")


def hps_pixels(im: Image.Image, size: int = 224) -> torch.Tensor:
    """HPSv2's preprocess_val: RGB (RGBA kept as is: `_convert_to_rgb_or_rgba`), ToTensor, ResizeMaxSize
    (tensor, bicubic), zero pad, normalise. For RGBA this returns 4 channels, which HPSv2's 3-channel
    patch embedding cannot take: the original has no score for RGBA images."""
    x = tvt.ToTensor()(im if im.mode == "RGBA" else im.convert("RGB"))
    h, w = x.shape[1:]
    scale = size / float(max(h, w))
    new = tuple(round(d * scale) for d in (h, w))
    x = tvt.functional.resize(x, list(new), tvt.InterpolationMode.BICUBIC)
    ph, pw = size - new[0], size - new[1]
    x = tvt.functional.pad(x, [pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)
    return torch.cat([tvt.Normalize(OPENAI_MEAN, OPENAI_STD)(x[:3]), x[3:]])[None]


def as_inputs(images: list[Image.Image]) -> dict[str, object]:
    """The same pictures in the input forms users pass: PIL list, uint8 tensor, float tensor, numpy list.

    The RGBA forms hold the 4-channel arrays of RGBA PIL images (one opaque, one with alpha 0 to 255):
    the reference gets those PIL images, as the original code would."""
    same = [im.convert("RGB").resize((200, 160)) for im in images[:2]]
    arr = np.stack([np.asarray(im) for im in same])
    same_rgba = [im.convert("RGBA").resize((200, 160)) for im in images[:2]]
    arr_rgba = np.stack([np.asarray(im) for im in same_rgba])
    return {
        "pil": images,
        "rgba_uint8": (same_rgba, torch.from_numpy(arr_rgba).permute(0, 3, 1, 2).contiguous()),
        "rgba_numpy": (same_rgba, list(arr_rgba)),
        "uint8": (same, torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()),
        "float": (same, torch.from_numpy(arr).permute(0, 3, 1, 2).float() / 255.0),
        # off the uint8 grid by < half a level: the scoring path rounds to uint8 as diffusers' numpy_to_pil
        "float_offgrid": (same, ((torch.from_numpy(arr).permute(0, 3, 1, 2).float() + jitter(arr.shape)) / 255.0).clamp(0, 1)),
    }


def jitter(shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    b, h, w, c = shape
    return (torch.rand(b, c, h, w, generator=g) - 0.5) * 0.8
