"""Moved to `mmreward.prompt_templates.edit`; this name stays so that older imports keep working (the same module object)."""

import sys

import mmreward.prompt_templates.edit as _moved

sys.modules[__name__] = _moved
