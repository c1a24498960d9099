"""Renamed to `diffusion_rl.sample_assignment`; this name stays so that older imports keep working (the same module object)."""

import sys

import diffusion_rl.sample_assignment as _moved

sys.modules[__name__] = _moved
