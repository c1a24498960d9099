"""Renamed to `vlm_rm.reward_shaping`; this name stays so that older imports keep working (the same module object)."""

import sys

import vlm_rm.reward_shaping as _moved

sys.modules[__name__] = _moved
