"""Qwen-Image-Edit pipelines at a reduced source-image area, for the default test suite.

diffusers' QwenImageEditPipeline resizes each source image to about 1024x1024 pixels
(`calculate_dimensions(1024 * 1024, ratio)` in its `__call__`) and QwenImageEditPlusPipeline to `VAE_IMAGE_SIZE`
(1024x1024) for the VAE and `CONDITION_IMAGE_SIZE` (384x384) for the VLM. On the tiny pipelines the VAE encoding
of one 1024x1024 source takes seconds on one core and gives 4096 condition tokens, which made these the slowest
tests of the suite. `small_source_areas(scale)` divides every one of those areas by `scale` for both sides at once:
the pipeline's `__call__` (the reference) and the adapters read the same patched module attributes, so the adapter
must still resize exactly as the pipeline does; only the number of pixels changes. Each family keeps one slow test
at the released areas (scale 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

# 1024x1024 / 64 = 128x128 VAE pixels (16x16 latents, 64 condition tokens); 384x384 / 64 = 48x48 VLM pixels
SMALL_AREA_SCALE = 64


@contextlib.contextmanager
def small_source_areas(scale: int = SMALL_AREA_SCALE) -> Iterator[None]:
    """Within the block, the Qwen-Image-Edit pipelines (and the adapters, which import the same names at call
    time) use source areas `scale` times smaller; scale 1 changes nothing."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    if scale == 1:
        yield
        return
    released = edit.calculate_dimensions

    def scaled(target_area, ratio):  # the edit pipeline passes the literal 1024 * 1024; the adapter its constant
        return released(target_area // scale, ratio)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(edit, "calculate_dimensions", scaled)
        mp.setattr(plus, "CONDITION_IMAGE_SIZE", plus.CONDITION_IMAGE_SIZE // scale)
        mp.setattr(plus, "VAE_IMAGE_SIZE", plus.VAE_IMAGE_SIZE // scale)
        yield
