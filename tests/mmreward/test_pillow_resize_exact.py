"""`pillow_bicubic` is Pillow's own 8-bit bicubic resize, bit for bit, over many shapes.

The reference is the installed Pillow itself (`PIL.Image.resize(..., BICUBIC)` on uint8 images), i.e. the
code path of HPSv3 and qwen_vl_utils (EditReward, UnifiedReward, EditScore, PaCo-Reward). Pillow 13.0.0's
libImaging/Resample.c (`ImagingResampleInner`, from python-pillow/Pillow@3cab8da1f3d546bd874b756589686c1cd66f0fe5)
takes the vertical pass first when the height shrinks by more than twice the columns the width loses; before
that (Pillow <= 12.3, e.g. python-pillow/Pillow@af037475be8634ba739744243164ba9e2c8346a6) it always went
horizontal first. Both passes round and clip to 8 bits, so the order changes the result.
"""

from __future__ import annotations

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from mmreward.backbones.qwen_vl import pillow_bicubic, pillow_vertical_first
from tests._helpers.parity_record import record_parity

# shapes the horizontal-first order got wrong (up to 15-16 levels), one-axis-up/other-down, equal axes
FIXED = [(62, 58, 56, 56), (100, 80, 56, 84), (58, 62, 56, 56), (333, 517, 224, 336), (40, 300, 120, 28),
         (300, 40, 28, 120), (64, 64, 64, 32), (64, 64, 32, 64), (9, 600, 600, 9), (600, 600, 8, 8), (8, 8, 600, 600),
         (1, 600, 7, 3), (1000, 17, 3, 17), (2, 3, 3, 2)]


def _grid(n: int = 60, seed: int = 34) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    shapes = [tuple(int(v) for v in rng.integers(8, 601, 4)) for _ in range(n)]
    return FIXED + shapes


def _ours(arr: np.ndarray, th: int, tw: int) -> np.ndarray:
    x = torch.from_numpy(arr).float()
    if arr.ndim == 3:
        x = x.permute(2, 0, 1)
    y = pillow_bicubic(x, th, tw)
    if arr.ndim == 3:
        y = y.permute(1, 2, 0)
    return y.numpy().astype(np.int64)


@pytest.mark.parity
def test_pillow_bicubic_bit_exact_over_shape_grid():
    rng = np.random.default_rng(0)
    actual, expected, bad = [], [], []
    for i, (h, w, th, tw) in enumerate(_grid()):
        # noise stresses the 8-bit clipping between the passes; every fourth case is grayscale ("L")
        arr = rng.integers(0, 256, (h, w) if i % 4 == 3 else (h, w, 3), dtype=np.uint8)
        ref = np.asarray(Image.fromarray(arr).resize((tw, th), Image.BICUBIC)).astype(np.int64)
        got = _ours(arr, th, tw)
        assert got.shape == ref.shape
        if not np.array_equal(got, ref):
            bad.append(((h, w, th, tw), int(np.abs(got - ref).max())))
        actual.append(got.ravel())
        expected.append(ref.ravel())
    max_abs, _ = record_parity(
        "pillow-bicubic-8bit", original=f"Pillow=={PIL.__version__} Image.resize BICUBIC", how="package",
        actual=np.concatenate(actual), expected=np.concatenate(expected), cases=("RGB", "grayscale", "odd sizes"),
        not_checked="RGBA (Pillow premultiplies alpha; callers convert to RGB first); Pillow < 13's "
        "horizontal-first order (legacy_order=True) is not run against an old Pillow here")
    assert not bad, f"(h, w, th, tw), max level difference: {bad}"
    assert max_abs == 0.0


def test_pass_order_rule_matches_pillow_13():
    # Pillow 13: vertical first iff (H - h) > 0 and (H - h) > 2 * (W - w)
    assert pillow_vertical_first((62, 58), (56, 56))
    assert pillow_vertical_first((100, 80), (56, 84))  # width grows: any height shrink goes first
    assert not pillow_vertical_first((58, 62), (56, 56))
    assert not pillow_vertical_first((333, 517), (224, 336))
    assert not pillow_vertical_first((64, 64), (128, 32))  # height grows: horizontal first
    assert not pillow_vertical_first((70, 60), (60, 55))  # 10 == 2 * 5: not strictly more


def test_legacy_order_is_horizontal_first_and_differs_where_the_rule_flips():
    arr = np.random.default_rng(1).integers(0, 256, (62, 58, 3), dtype=np.uint8)
    x = torch.from_numpy(arr).permute(2, 0, 1).float()
    new, old = pillow_bicubic(x, 56, 56), pillow_bicubic(x, 56, 56, legacy_order=True)
    assert not torch.equal(new, old)
    ref = np.asarray(Image.fromarray(arr).resize((56, 56), Image.BICUBIC))
    assert np.array_equal(new.permute(1, 2, 0).numpy(), ref.astype(np.float32))
    # where the rule keeps horizontal first, both orders agree
    arr2 = np.random.default_rng(2).integers(0, 256, (58, 62, 3), dtype=np.uint8)
    x2 = torch.from_numpy(arr2).permute(2, 0, 1).float()
    assert torch.equal(pillow_bicubic(x2, 56, 56), pillow_bicubic(x2, 56, 56, legacy_order=True))
