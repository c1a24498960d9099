"""The media reference convention: how a training sample carries its images when the trainer drops them.

Trainers such as verl and EasyR1 hand reward functions only text fields (the response, the ground
truth, an `extra_info` dict). A sample keeps its media visible to the reward by storing a
reference in one of those fields:

  - a dict (e.g. verl's extra_info) with the key "mmreward_media": a path or a list of paths;
  - a JSON string of such a dict (e.g. EasyR1's ground_truth), other keys kept for the task;
  - a string "mmreward-media:<path>[|<path>...]".

`media_ref(paths, **extra)` writes the JSON form; `find_media(*fields)` reads the first field that
holds a reference. Paths are local files (or anything `mmreward.media` reads).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MEDIA_KEY = "mmreward_media"
MEDIA_PREFIX = "mmreward-media:"


def media_ref(paths: str | Sequence[str], **extra: Any) -> str:
    """A JSON string carrying `paths` (and any task fields in `extra`) under the media key."""
    items = [paths] if isinstance(paths, str) else list(paths)
    return json.dumps({MEDIA_KEY: items, **extra})


def parse_media_ref(value: Any) -> list[str] | None:
    """The media paths referenced by one field value, or None when it holds no reference."""
    if isinstance(value, dict):
        found = value.get(MEDIA_KEY)
        if found is None:
            return None
        return [found] if isinstance(found, str) else [str(p) for p in found]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(MEDIA_PREFIX):
            return [p for p in text[len(MEDIA_PREFIX):].split("|") if p]
        if text.startswith("{") and MEDIA_KEY in text:
            try:
                return parse_media_ref(json.loads(text))
            except json.JSONDecodeError:
                return None
    return None


def find_media(*fields: Any) -> list[str] | None:
    """The first media reference found among `fields`."""
    for value in fields:
        paths = parse_media_ref(value)
        if paths:
            return paths
    return None
