"""Parse GenEval's prompt templates into structured clauses.

Templates (GenEval, Ghosh et al. 2023), each optionally prefixed by "a photo of":
  single_object "a {obj}"; two_object "a {obj} and a {obj}"; counting "{n} {objs}";
  colors "a {color} {obj}"; color_attr "a {color} {obj} and a {color} {obj}";
  position "a {obj} {left of | right of | above | below} a {obj}".
Numbers are words (one..ten) or digits; plural nouns are singularised so that detector queries and
detections use one name per class.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmreward.errors import RewardInputError

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "gray", "grey")
RELATIONS = ("left of", "right of", "above", "below")
NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "zero": 0, "no": 0,
}  # fmt: skip
IRREGULAR_PLURALS = {
    "people": "person", "men": "man", "women": "woman", "children": "child", "mice": "mouse", "geese": "goose",
    "feet": "foot", "teeth": "tooth", "knives": "knife", "wolves": "wolf", "leaves": "leaf", "sheep": "sheep",
    "skis": "skis", "scissors": "scissors", "glasses": "glass", "buses": "bus", "benches": "bench",
    "crosses": "cross", "boxes": "box", "giraffes": "giraffe",
}  # fmt: skip


@dataclass(frozen=True)
class ObjectClause:
    name: str
    count: int = 1
    color: str | None = None


@dataclass(frozen=True)
class CompositionSpec:
    """What a prompt asks for. `relation` relates objects[0] to objects[1] ("a cat left of a dog")."""

    tag: str
    objects: tuple[ObjectClause, ...]
    relation: str | None = None

    @property
    def exact_count(self) -> bool:
        """Counting prompts ask for exactly `count` objects (GenEval also excludes count + 1)."""
        return self.tag == "counting"


def singular(noun: str) -> str:
    words = noun.split()
    last = words[-1]
    if last in IRREGULAR_PLURALS:
        last = IRREGULAR_PLURALS[last]
    elif last.endswith("ies") and len(last) > 4:
        last = last[:-3] + "y"
    elif re.search(r"(ches|shes|xes|sses|zzes)$", last):
        last = last[:-2]
    elif last.endswith("s") and not last.endswith(("ss", "us", "is")):
        last = last[:-1]
    return " ".join([*words[:-1], last])


_NUMBER = r"(?P<num>\d+|" + "|".join(NUMBER_WORDS) + r")"
_COLOR = r"(?:(?P<color>" + "|".join(COLORS) + r")\s+)?"
_NP = re.compile(rf"^{_NUMBER}\s+{_COLOR}(?P<noun>[a-z][a-z \-]*?)$")


def _parse_np(text: str, prompt: str) -> ObjectClause:
    m = _NP.match(text.strip())
    if not m:
        raise RewardInputError(
            f"prompts: cannot parse the object phrase {text!r} in {prompt!r}. Expected GenEval's form "
            "'<a|an|number> [colour] <object>', e.g. 'a photo of two red apples' or 'a cat left of a dog'."
        )
    num = m.group("num")
    count = int(num) if num.isdigit() else NUMBER_WORDS[num]
    noun = " ".join(m.group("noun").split())
    return ObjectClause(singular(noun) if count != 1 else noun, count, m.group("color"))


def parse_prompt(prompt: str) -> CompositionSpec:
    """The clauses of a GenEval-template prompt; a RewardInputError names the part that does not parse."""
    text = " ".join(prompt.lower().strip().rstrip(".").split())
    text = re.sub(r"^(a photo of|an image of|a picture of)\s+", "", text)
    if not text:
        raise RewardInputError(f"prompts: empty compositional prompt {prompt!r}")
    for rel in RELATIONS:
        parts = re.split(rf"\s+(?:is\s+)?(?:to\s+the\s+)?{rel}\s+(?:the\s+)?", text, maxsplit=1)
        if len(parts) == 2:
            a, b = (_parse_np(p, prompt) for p in parts)
            return CompositionSpec("position", (a, b), rel)
    parts = re.split(r"\s+and\s+", text)
    if len(parts) > 2:
        raise RewardInputError(f"prompts: GenEval prompts name at most two object groups, got {len(parts)} in {prompt!r}")
    objects = tuple(_parse_np(p, prompt) for p in parts)
    return CompositionSpec(_tag_of(objects), objects)


TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def _metadata_object(item: Any, where: str) -> ObjectClause:
    if not isinstance(item, Mapping) or not isinstance(item.get("class"), str) or not item["class"].strip():
        raise RewardInputError(f"{where}: expected {{'class': str, 'count': int, ...}}, got {item!r}")
    count = item.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise RewardInputError(f"{where}: 'count' must be a whole number >= 0, got {count!r}")
    color = item.get("color")
    if color is not None and color not in COLORS:
        raise RewardInputError(f"{where}: 'color' must be one of {COLORS}, got {color!r}")
    return ObjectClause(item["class"].strip(), count, color)


def spec_from_metadata(meta: Mapping[str, Any]) -> CompositionSpec:
    """The clauses of a GenEval `evaluation_metadata.jsonl` row, read from its fields instead of its prompt.

    Row: {"tag", "include": [{"class", "count", "color"?, "position"?: [relation, target index]}],
    "exclude"?: [...]}. GenEval writes a position clause on the *second* include ("a dog right of a
    teddy bear" is include [teddy bear, dog with ["right of", 0]]); the spec puts the object that holds
    the relation first, as `parse_prompt` does. Exclude clauses are GenEval's counting form only
    (count + 1 of the same class), which `evaluate` adds itself for counting rows.
    """
    where = f"metadata {dict(meta)!r}"[:200]
    include = meta.get("include")
    if not isinstance(include, Sequence) or isinstance(include, str) or not 1 <= len(include) <= 2:
        raise RewardInputError(f"{where}: 'include' must list one or two objects (GenEval's rows), got {include!r}")
    objects = [_metadata_object(item, f"{where}: include[{i}]") for i, item in enumerate(include)]
    positioned = [i for i, item in enumerate(include) if item.get("position") is not None]
    relation = None
    if positioned:
        i = positioned[0]
        pos = include[i]["position"]
        if (len(positioned) > 1 or len(objects) != 2 or not isinstance(pos, Sequence) or len(pos) != 2
                or pos[0] not in RELATIONS or pos[1] != 1 - i):
            raise RewardInputError(
                f"{where}: 'position' must be [relation, index of the other object] on one of two objects, "
                f"with relation in {RELATIONS}; got {pos!r}"
            )
        relation = pos[0]
        objects = [objects[i], objects[1 - i]]
    tag = meta.get("tag")
    if tag is None:
        tag = "position" if relation else _tag_of(objects)
    if tag not in TAGS:
        raise RewardInputError(f"{where}: 'tag' must be one of {TAGS}, got {tag!r}")
    for j, item in enumerate(meta.get("exclude") or []):
        ex = _metadata_object(item, f"{where}: exclude[{j}]")
        if tag != "counting" or not any(o.name == ex.name and o.count + 1 == ex.count for o in objects):
            raise RewardInputError(
                f"{where}: exclude[{j}] is supported only in GenEval's counting form (the included class "
                "with count + 1, on a 'counting' row)"
            )
    return CompositionSpec(tag, tuple(objects), relation)


def _tag_of(objects: Sequence[ObjectClause]) -> str:
    """GenEval's tag for objects without a relation, as `parse_prompt` assigns it."""
    if len(objects) == 2:
        return "color_attr" if all(o.color for o in objects) else "two_object"
    if objects[0].count != 1:
        return "counting"
    return "colors" if objects[0].color else "single_object"
