"""Batched preprocessing against torchvision / PIL reference pipelines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from mmreward import preprocess as T
from mmreward.errors import RewardInputError


def test_center_crop_rounding_rules():
    x = torch.arange(7 * 9, dtype=torch.float32).view(1, 1, 7, 9)
    # torchvision rounds the offset: (7-4)/2 = 1.5 -> 2, (9-4)/2 = 2.5 -> 2 (banker's rounding)
    torch.testing.assert_close(T.center_crop(x, 4, rounding="round"), TF.center_crop(x, [4, 4]))
    floor = T.center_crop(x, 4, rounding="floor")
    torch.testing.assert_close(floor, x[..., 1:5, 2:6])  # Hugging Face: (h - th) // 2
    padded = T.center_crop(torch.ones(1, 3, 2, 2), 4)
    assert padded.shape == (1, 3, 4, 4) and float(padded.sum()) == 12.0
    with pytest.raises(RewardInputError, match="rounding"):
        T.center_crop(x, 4, rounding="ceil")


def test_resize_shorter_side_matches_torchvision():
    x = torch.rand(2, 3, 33, 51)
    ours = T.resize(x, 16, interpolation="bicubic", antialias=True)
    ref = TF.resize(x, [16], interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
    assert ours.shape == ref.shape == (2, 3, 16, 24)
    torch.testing.assert_close(ours, ref)


def test_resize_longest_and_pad_matches_manual_pil_pipeline():
    arr = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    x = torch.from_numpy(arr).permute(2, 0, 1).float()[None] / 255
    out = T.resize_longest_and_pad(x, 20, interpolation="bilinear")
    assert out.shape == (1, 3, 20, 20)
    # independent: longest 50 -> 20, so 30 -> 12; pad 8 rows: 4 above, 4 below
    ref = TF.resize(x, [12, 20], interpolation=TF.InterpolationMode.BILINEAR, antialias=True)
    torch.testing.assert_close(out[..., 4:16, :], ref)
    assert float(out[..., :4, :].abs().sum()) == 0 and float(out[..., 16:, :].abs().sum()) == 0


def test_map_groups_keeps_input_order_for_mixed_sizes():
    items = [torch.full((3, 4, 4), 0.1), torch.full((3, 6, 2), 0.2), torch.full((3, 4, 4), 0.3)]
    out = T.resize(items, (2, 2), interpolation="bilinear")
    assert out.shape == (3, 3, 2, 2)
    torch.testing.assert_close(out[:, 0, 0, 0], torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(RewardInputError, match="resized or cropped"):
        T.map_groups(lambda t: t, items)


def test_normalize_and_quantize():
    x = torch.rand(2, 3, 4, 4)
    ref = TF.normalize(x, list(T.OPENAI_CLIP_MEAN), list(T.OPENAI_CLIP_STD))
    torch.testing.assert_close(T.normalize(x, T.OPENAI_CLIP_MEAN, T.OPENAI_CLIP_STD), ref)
    arr = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    pil_round_trip = torch.from_numpy(np.array(Image.fromarray(arr))).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(T.quantize_uint8(x[0]), pil_round_trip)


def _cutout_rgba(h: int = 120, w: int = 180) -> np.ndarray:
    """Bright hidden colour under alpha 0 (left third), an alpha ramp 0..255 (middle), opaque (right)."""
    g = np.random.default_rng(0)
    rgb = (g.random((h, w, 3)) * 0.5 + 0.5) * 255
    alpha = np.concatenate([np.zeros(w // 3), np.linspace(0, 255, w // 3), np.full(w - 2 * (w // 3), 255)])
    return np.concatenate([rgb, np.broadcast_to(alpha[None, :, None], (h, w, 1))], axis=-1).round().astype(np.uint8)


@pytest.mark.parametrize("size", [64, 224])
def test_rgba_resize_is_premultiplied_like_pillow(size):
    arr = _cutout_rgba()
    oh, ow = T.output_size_shorter_side(*arr.shape[:2], size)
    want = torch.from_numpy(np.asarray(Image.fromarray(arr).resize((ow, oh), Image.BICUBIC)).copy())
    want = want.permute(2, 0, 1).float() / 255
    x = torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255
    got = T.resize(x, size)[0]
    rgb_first = T.resize(x[:, :3], size)[0].clamp(0, 1)
    assert got.shape == (4, oh, ow)
    err, err_rgb_first = (got[:3] - want[:3]).abs(), (rgb_first - want[:3]).abs()
    # fully transparent pixels come out black, as in Pillow, instead of showing the hidden colour
    transparent = want[3] == 0
    assert transparent.any() and float(got[:3, transparent].abs().max()) == 0.0
    assert float(err_rgb_first[:, transparent].min()) > 0.4
    # elsewhere the float path deviates only by Pillow's 8-bit rounding of premultiplied colour, which is
    # amplified by 1/alpha where alpha is small: bound it where alpha >= 1/8 and on average
    assert float(err[:, want[3] >= 0.125].max()) < 0.06
    assert float(err.mean()) < 0.2 * float(err_rgb_first.mean())
    torch.testing.assert_close(got[3], want[3], atol=2 / 255, rtol=0)
    # differentiable, with finite gradients where alpha is 0
    x.requires_grad_(True)
    T.resize(x, size)[:, :3].sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[:, :3].abs().sum() > 0


def test_preprocess_card_alpha_conventions():
    from mmreward.errors import ConfigError
    from mmreward.preprocess import ImagePreprocess

    rgba = torch.from_numpy(_cutout_rgba()).permute(2, 0, 1).float() / 255
    rgb = rgba[:3]
    drop = ImagePreprocess(size=64, crop=64, alpha="drop_first")
    torch.testing.assert_close(drop([rgba]), drop([rgb]), atol=0, rtol=0)
    later = ImagePreprocess(size=64, crop=64, alpha="resize_then_drop")
    assert (later([rgba]) - drop([rgb])).abs().max() > 1.0  # transparent pixels black, not the hidden colour
    # items with and without alpha, of different sizes, in one list
    assert later([rgba, rgb[:, :100, :150]]).shape == (2, 3, 64, 64)
    white = ImagePreprocess(size=64, crop=64, alpha="composite:#ffffff")([rgba])
    torch.testing.assert_close(white, ImagePreprocess(size=64, crop=64)([rgb * rgba[3:] + (1 - rgba[3:])]))
    with pytest.raises(RewardInputError, match="transparent"):
        ImagePreprocess(size=64, crop=64, alpha="reject")([rgba])
    for bad in ("drop", "composite:teal", "composite:#12"):
        with pytest.raises(ConfigError, match="alpha must be"):
            ImagePreprocess(alpha=bad)
