"""Renamed to `diffusion_rl.memory_settings`; this name stays so that older imports keep working (the same module object)."""

import sys

import diffusion_rl.memory_settings as _moved

sys.modules[__name__] = _moved
