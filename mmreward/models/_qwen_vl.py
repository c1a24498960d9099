"""Moved to `mmreward.backbones.qwen_vl`; this name stays so that older imports keep working (the same module object)."""

import sys

import mmreward.backbones.qwen_vl as _moved

sys.modules[__name__] = _moved
