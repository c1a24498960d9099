"""Moved to `mmreward.backbones.clip`; this name stays so that older imports keep working (the same module object)."""

import sys

import mmreward.backbones.clip as _moved

sys.modules[__name__] = _moved
