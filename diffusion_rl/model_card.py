"""Generation defaults a pipeline folder carries in its card (`shapesworld.json`'s `generation_defaults`).

The shipped ShapesWorld generators make 32x32 images or 4-frame clips with a 4-20 token text encoder; the
diffusers defaults (1024 px, 226 or 512 tokens, 81 frames) are geometries they cannot make. Every place that
loads a pipeline folder (training, best-of-N, ReNO) fills the settings the user left unset from these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmreward.errors import CheckpointError

CARD_FILES = ("shapesworld.json",)
# the settings a card may give, and their types
FIELDS = {"height": int, "width": int, "num_frames": int, "max_sequence_length": int, "num_inference_steps": int,
          "guidance_scale": float}


def read_generation_defaults(source: str | Path) -> dict[str, Any]:
    """The card's generation defaults for a local pipeline folder ({} for a hub id or a folder without a card)."""
    folder = Path(str(source)).expanduser()
    for name in CARD_FILES:
        card = folder / name
        if not card.is_file():
            continue
        try:
            data = json.loads(card.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"{card} is not readable JSON ({exc})") from None
        gd = data.get("generation_defaults", {}) if isinstance(data, dict) else {}
        if not isinstance(gd, dict):
            raise CheckpointError(f"{card}: generation_defaults must be an object, got {type(gd).__name__}")
        out = {}
        for key, kind in FIELDS.items():
            if key in gd:
                val = gd[key]
                if isinstance(val, bool) or not isinstance(val, (int, float)) or (kind is int and val != int(val)):
                    raise CheckpointError(f"{card}: generation_defaults.{key} must be a number, got {val!r}")
                out[key] = kind(val)
        return out
    return {}


def text_token_limit(pipeline: Any) -> tuple[str, int] | None:
    """(encoder name, max positions) of the text encoder that takes `max_sequence_length` tokens (the highest
    numbered one: T5 in SD3/FLUX, the only one in Wan), when its architecture has a position limit."""
    for name in ("text_encoder_3", "text_encoder_2", "text_encoder"):
        enc = getattr(pipeline, name, None)
        if enc is not None:
            limit = getattr(getattr(enc, "config", None), "max_position_embeddings", None)
            return (name, int(limit)) if isinstance(limit, int) else None
    return None
