"""Our 8-bit torchvision resizes against torchvision itself, over many shapes.

- `torchvision_bicubic_uint8` is torchvision's v1 `transforms.functional.resize` on a uint8 tensor (BICUBIC,
  antialias=True): cast to float32, antialiased bicubic, clamp, round. qwen_vl_utils and VideoAlign
  (`vision_process.py`) resize video frames this way.
- `torch_native_bicubic_uint8` is what `transforms.v2.functional.resize` does to a CPU uint8 tensor: torch's native
  uint8 kernel (pytorch aten/src/ATen/native/cpu/UpSampleKernel.cpp, `_compute_index_ranges_int16_weights` and
  the separable uint8 loops: int16 weights, horizontal then vertical, 8-bit rounding between the passes).
The reference is the installed torchvision; the two paths differ from each other by up to ~25 levels on noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F1
from torchvision.transforms.v2 import functional as F2

from mmreward.backbones.qwen_vl import torch_native_bicubic_uint8, torchvision_bicubic_uint8
from tests._helpers.parity_record import record_parity

FIXED = [(62, 58, 56, 56), (100, 80, 56, 84), (40, 300, 120, 28), (300, 40, 28, 120), (9, 600, 600, 9)]


def _cases(n: int = 60, seed: int = 34):
    rng = np.random.default_rng(seed)
    shapes = FIXED + [tuple(int(v) for v in rng.integers(8, 601, 4)) for _ in range(n)]
    data = np.random.default_rng(0)
    for i, (h, w, th, tw) in enumerate(shapes):
        c = 1 if i % 4 == 3 else 3  # every fourth case is one channel (grayscale)
        yield torch.from_numpy(data.integers(0, 256, (c, h, w), dtype=np.uint8)), th, tw


def _compare(ours, theirs, family: str, original: str):
    actual, expected, bad = [], [], []
    for u8, th, tw in _cases():
        got = ours(u8.float(), th, tw).to(torch.int64)
        ref = theirs(u8, [th, tw], interpolation=InterpolationMode.BICUBIC, antialias=True).to(torch.int64)
        assert got.shape == ref.shape
        if not torch.equal(got, ref):
            bad.append((tuple(u8.shape), (th, tw), int((got - ref).abs().max())))
        actual.append(got.flatten())
        expected.append(ref.flatten())
    max_abs, _ = record_parity(family, original=original, how="package", actual=torch.cat(actual),
                               expected=torch.cat(expected), cases=("RGB", "grayscale", "odd sizes"),
                               not_checked="GPU tensors (v2 takes the float path there, as v1 does)")
    assert not bad, f"(shape, target, max level difference): {bad}"
    assert max_abs == 0.0


@pytest.mark.parity
def test_torchvision_v1_uint8_bicubic_bit_exact():
    _compare(torchvision_bicubic_uint8, F1.resize, "torchvision-bicubic-uint8",
             f"torchvision=={torchvision.__version__} transforms.functional.resize BICUBIC antialias uint8")


@pytest.mark.parity
def test_torchvision_v2_cpu_uint8_bicubic_bit_exact():
    _compare(torch_native_bicubic_uint8, F2.resize, "torch-native-bicubic-uint8",
             f"torchvision=={torchvision.__version__} transforms.v2.functional.resize BICUBIC antialias uint8 (CPU)")


def test_the_two_torchvision_paths_differ():
    # guards the premise above: if torchvision ever unifies them, one function can go
    u8 = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (3, 288, 311), dtype=np.uint8))
    v1 = F1.resize(u8, [455, 571], interpolation=InterpolationMode.BICUBIC, antialias=True)
    v2 = F2.resize(u8, [455, 571], interpolation=InterpolationMode.BICUBIC, antialias=True)
    assert not torch.equal(v1, v2)
    assert not torch.equal(torchvision_bicubic_uint8(u8.float(), 455, 571), torch_native_bicubic_uint8(u8.float(), 455, 571))
