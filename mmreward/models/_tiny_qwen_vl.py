"""Moved to `mmreward.backbones.tiny_qwen_vl`; this name stays so that older imports keep working (the same module object)."""

import sys

import mmreward.backbones.tiny_qwen_vl as _moved

sys.modules[__name__] = _moved
