"""Captions from prompt specs (GenEval-style templates) and the inverse parser from text to spec.

`caption(spec)` gives the canonical prompt ("a red circle left of a blue square", "three crosses");
`caption(spec, photo=True)` the GenEval phrasing with "a photo of ...". `parse_prompt(text)` accepts
these and common variants ("an image of", "to the left of", digits, "one", trailing period), so
rewards can check arbitrary prompts that stay inside ShapesWorld's vocabulary.
"""

from __future__ import annotations

import re

from mmreward.errors import RewardInputError
from mmreward.synthetic.prompts import (
    COLORS,
    NUMBERS,
    RELATIONS,
    SHAPES,
    ObjectClause,
    PromptSpec,
    classify,
)

PLURALS: dict[str, str] = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}
SYNONYMS: dict[str, str] = {"plus": "cross", "pluses": "cross", "plus sign": "cross", "x": "cross"}


class PromptParseError(RewardInputError):
    """A prompt that does not describe a ShapesWorld scene."""


def _noun_phrase(o: ObjectClause) -> str:
    colour = f"{o.color} " if o.color else ""
    if o.count == 1:
        return f"a {colour}{o.shape}"
    return f"{NUMBERS[o.count]} {colour}{PLURALS[o.shape]}"


def photo_phrasing(text: str, photo: bool = True) -> str:
    """GenEval's "a photo of ..." phrasing of a caption (or the caption itself when photo is False)."""
    return f"a photo of {text}" if photo else text


def caption(spec: PromptSpec, photo: bool = False) -> str:
    """The prompt text of a spec."""
    parts = [_noun_phrase(o) for o in spec.objects]
    text = f"{parts[0]} {spec.relation} {parts[1]}" if spec.relation else " and ".join(parts)
    return photo_phrasing(text, photo)


_WORD_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}
_SHAPE_WORDS = {**{s: s for s in SHAPES}, **{p: s for s, p in PLURALS.items()}, **SYNONYMS}
_NP = re.compile(
    r"^(?:(?P<num>a|an|one|two|three|four|\d+)\s+)?(?:(?P<color>" + "|".join(COLORS) + r")\s+)?"
    r"(?P<shape>" + "|".join(sorted(map(re.escape, _SHAPE_WORDS), key=len, reverse=True)) + r")$"
)
_RELATION_PATTERNS = [
    (r"\s+(?:to the|on the)?\s*left of\s+", "left of"),
    (r"\s+(?:to the|on the)?\s*right of\s+", "right of"),
    (r"\s+(?:above|over)\s+", "above"),
    (r"\s+(?:below|under|beneath)\s+", "below"),
]
_PREFIX = re.compile(r"^(?:a|an)\s+(?:photo|image|picture|rendering|drawing)\s+of\s+")


def _parse_np(text: str, prompt: str) -> ObjectClause:
    m = _NP.match(text.strip())
    if not m:
        raise PromptParseError(
            f"prompt {prompt!r}: cannot read the object phrase {text.strip()!r}. ShapesWorld phrases look like "
            f"'a red circle' or 'three squares' with shapes {list(SHAPES)} and colours {list(COLORS)}."
        )
    num = m.group("num")
    count = 1 if num is None else (int(num) if num.isdigit() else _WORD_NUMBERS[num])
    if not 1 <= count <= 4:
        raise PromptParseError(f"prompt {prompt!r}: counts must be 1-4, got {count}")
    return ObjectClause(_SHAPE_WORDS[m.group("shape")], count, m.group("color"))


def parse_prompt(text: str) -> PromptSpec:
    """The structured spec of a ShapesWorld prompt; raises PromptParseError for anything else."""
    if not isinstance(text, str):
        raise PromptParseError(f"prompt: expected a string, got {type(text).__name__}")
    t = re.sub(r"\s+", " ", text.lower().strip().rstrip(".").strip())
    t = _PREFIX.sub("", t)
    relation = None
    for pattern, rel in _RELATION_PATTERNS:
        pieces = re.split(pattern, t)
        if len(pieces) == 2:
            relation, phrases = rel, pieces
            break
    else:
        phrases = re.split(r"\s+and\s+|\s*,\s*", t)
    if len(phrases) > 2:
        raise PromptParseError(f"prompt {text!r}: ShapesWorld prompts name at most two kinds of object")
    objects = tuple(_parse_np(p, text) for p in phrases)
    if relation is not None and any(o.count != 1 for o in objects):
        raise PromptParseError(f"prompt {text!r}: relations are defined between single objects only")
    if len(objects) == 2 and objects[0].shape == objects[1].shape and objects[0].color == objects[1].color:
        raise PromptParseError(f"prompt {text!r}: the two objects must differ in shape or colour")
    if sum(o.count for o in objects) > 4:
        raise PromptParseError(f"prompt {text!r}: at most four objects fit in a ShapesWorld scene")
    return PromptSpec(classify(objects, relation), objects, relation)


assert set(RELATIONS) == {r for _, r in _RELATION_PATTERNS}
