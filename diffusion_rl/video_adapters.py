"""Moved to `diffusion_rl.adapters.cogvideox` and `diffusion_rl.adapters.ltx` (issue 29); this name stays so that
older imports keep working. New code imports from `diffusion_rl.adapters`."""

from diffusion_rl.adapters.base import PipelineAdapter, VideoAdapter
from diffusion_rl.adapters.cogvideox import CogVideoXAdapter
from diffusion_rl.adapters.ltx import (  # noqa: F401 - re-exported for older imports
    LTX_DEFAULT_FRAME_RATE,
    LTX_DEFAULT_FRAMES,
    LTX_DEFAULT_HEIGHT,
    LTX_DEFAULT_WIDTH,
    LTX_MAX_SEQUENCE_LENGTH,
    LTXAdapter,
)

_VideoAdapter = VideoAdapter  # the old private name
VIDEO_ADAPTERS: dict[str, type[PipelineAdapter]] = {"cogvideox": CogVideoXAdapter, "ltx": LTXAdapter}
