"""DDPO's JPEG (in)compressibility rewards against an independent encoder run (OpenCV's libjpeg, or PIL directly)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import mmreward
from tests._helpers.tolerances import assert_close_scaled

skimage_data = pytest.importorskip("skimage.data")


def pil_jpeg_kb(arr: np.ndarray, quality: int = 95) -> float:
    """DDPO's computation written out: PIL image -> JPEG at quality 95 in memory -> bytes / 1000."""
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.tell() / 1000


def test_sizes_match_a_direct_pil_encoding_of_real_photos():
    photos = [skimage_data.astronaut(), skimage_data.coffee(), skimage_data.chelsea()]
    comp = mmreward.load("jpeg-compressibility").score(None, photos)
    incomp = mmreward.load("jpeg-incompressibility").score(None, photos)
    expected = torch.tensor([pil_jpeg_kb(p) for p in photos])
    assert_close_scaled(incomp.scores, expected, rel=1e-6)  # ~100 kB: 1e-6 of it is 0.1 byte
    assert_close_scaled(comp.scores, -expected, rel=1e-6)
    assert_close_scaled(comp.details["size_kb"], expected, rel=1e-6)


def test_sizes_agree_with_another_jpeg_encoder_and_rank_flat_below_noise():
    cv2 = pytest.importorskip("cv2")
    photo = skimage_data.astronaut()
    ok, encoded = cv2.imencode(".jpg", photo[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    ours = mmreward.load("jpeg-incompressibility").score(None, photo).scores.item()
    # both use libjpeg's baseline quantisation at quality 95; headers and Huffman tables differ slightly
    assert ours == pytest.approx(len(encoded) / 1000, rel=0.1)
    flat = torch.full((1, 3, 256, 256), 0.5)
    noise = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(0))
    sizes = mmreward.load("jpeg-compressibility").score(None, torch.cat([flat, noise])).scores
    assert sizes[0] > sizes[1]  # a flat image is more compressible
    assert -sizes[1] > 20 * -sizes[0]
