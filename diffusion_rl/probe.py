"""Renamed to `diffusion_rl.ratio_probe`; this name stays so that older imports keep working (the same module object)."""

import sys

import diffusion_rl.ratio_probe as _moved

sys.modules[__name__] = _moved
