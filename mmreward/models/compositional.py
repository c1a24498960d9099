"""Renamed to `mmreward.models.geneval_reward`; this name stays so that older imports keep working (the same module object)."""

import sys

import mmreward.models.geneval_reward as _moved

sys.modules[__name__] = _moved
