"""ShapesWorld VQA: questions about rendered ShapesWorld scenes with exact answers, and their chat datasets.

Question kinds (each answer is computed from the scene's ground truth, never from a model):
  count     "How many circles are there?"                         -> "3" (digits; words are accepted)
  color     "What colour is the triangle?"                        -> "red" (one object of that shape)
  shape     "What shape is the red object?"                       -> "circle" (one object of that colour)
  position  "Is the red circle left of the blue square?"          -> "yes" / "no" (GenEval's position rule)
  which     "Which image shows the red circle: the first or the second?" over two images -> "first"
  caption   "Describe the image in one phrase."                   -> "a red circle and a blue square"
            (checked by parsing the response with `captions.parse_prompt` and running the exact checker)

Splits follow ShapesWorld's held-out split (`prompts.HELD_OUT_PAIRS`): held-out questions come from
held-out scenes; training questions come from training scenes and never name, answer with or count a
held-out colour-shape pair ("What colour is the square?" -> "blue" is held out, as is the caption
"a blue square"), while every held-out question does (`is_held_out_question`). Count and which-image
question texts can repeat across splits; their images differ.

`normalize_answer(kind, text)` reads the answer out of a free-form response ("There are 3 circles." ->
"3", "<answer>three</answer>" -> "3", "Crimson." -> "red"); it returns None when the response names no
answer or several different ones. `to_trl_rows` and `to_verl_rows` write the chat formats the trainers'
datasets use.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import RewardInputError
from mmreward.synthetic.captions import PLURALS, SYNONYMS, caption
from mmreward.synthetic.checker import relation_holds
from mmreward.synthetic.prompts import (
    COLORS,
    HELD_OUT_COUNTS,
    HELD_OUT_PAIRS,
    RELATIONS,
    SHAPES,
    ObjectClause,
    PromptSpec,
    classify,
)
from mmreward.synthetic.scenes import Scene, render, sample_scenes

KINDS: tuple[str, ...] = ("count", "color", "shape", "position", "which", "caption")
SPLITS: tuple[str, ...] = ("train", "heldout")
CAPTION_QUESTION = "Describe the image in one phrase."
ANSWER_FORMAT = "Answer with <answer>...</answer>."

# Answer vocabularies. Colour synonyms are the common names of the palette's hues.
NUMBER_WORDS: dict[str, int] = {"zero": 0, "no": 0, "none": 0, "one": 1, "two": 2, "three": 3, "four": 4,
                                "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
COLOR_SYNONYMS: dict[str, str] = {
    **{c: c for c in COLORS},
    "crimson": "red", "scarlet": "red", "lime": "green", "navy": "blue", "azure": "blue", "gold": "yellow",
    "golden": "yellow", "violet": "purple", "magenta": "purple", "lilac": "purple", "lavender": "purple",
}
SHAPE_WORDS: dict[str, str] = {**{s: s for s in SHAPES}, **{p: s for s, p in PLURALS.items()},
                               **{k: v for k, v in SYNONYMS.items() if k != "x"}}
YES_WORDS = ("yes", "yeah", "yep", "true", "correct")
NO_WORDS = ("no", "nope", "false", "incorrect", "not")
FIRST_WORDS = ("first", "1", "1st", "one", "left")
SECOND_WORDS = ("second", "2", "2nd", "two", "right")

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[a-z]+|\d+")


@dataclass(frozen=True)
class VQAItem:
    """One question: its kind, text, canonical answer and the scene(s) its image(s) show."""

    kind: str
    question: str
    answer: str
    scenes: tuple[Scene, ...]
    split: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


# ----------------------------------------------------------------------------------------------
# answers
# ----------------------------------------------------------------------------------------------
def extract_answer(response: str) -> tuple[str, bool]:
    """The answer span of a response and whether it used the <answer>...</answer> format (the last tag wins)."""
    tags = _ANSWER_TAG.findall(response)
    if tags:
        return tags[-1].strip(), True
    return response.strip(), False


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("plus sign", "plus"))


def _unique(values: list[Any]) -> Any:
    """The one distinct value named, else None (no answer, or a hedge such as 'red or blue')."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def normalize_answer(kind: str, text: str) -> str | None:
    """The canonical form of an answer of `kind` read from free-form text, or None when there is none.

    count: digits or number words -> digits; color: palette names and synonyms; shape: singular,
    plural and 'plus'; position: yes/no words (a lone 'not'/'no' counts as no); which: first/second,
    1/2, left/right. Captions are canonicalised by `captions.parse_prompt` (see `normalize_caption`).
    """
    if kind not in KINDS:
        raise RewardInputError(f"kind: expected one of {KINDS}, got {kind!r}")
    words = _words(text)
    if kind == "count":
        # 'no' as a count only when nothing else is said ('No circles.'), so 'no, there are 2' reads 2
        nums = [int(w) if w.isdigit() else NUMBER_WORDS[w] for w in words if w.isdigit() or w in NUMBER_WORDS]
        strong = [int(w) if w.isdigit() else NUMBER_WORDS[w] for w in words
                  if w.isdigit() or (w in NUMBER_WORDS and w not in ("no", "none"))]
        value = _unique(strong) if strong else _unique(nums)
        return None if value is None else str(value)
    if kind == "color":
        return _unique([COLOR_SYNONYMS[w] for w in words if w in COLOR_SYNONYMS])
    if kind == "shape":
        return _unique([SHAPE_WORDS[w] for w in words if w in SHAPE_WORDS])
    if kind == "position":
        return _unique(["yes" if w in YES_WORDS else "no" for w in words if w in YES_WORDS or w in NO_WORDS])
    if kind == "which":
        return _unique(["first" if w in FIRST_WORDS else "second" for w in words
                        if w in FIRST_WORDS or w in SECOND_WORDS])
    return normalize_caption(text)


_CAPTION_PREFIX = re.compile(
    r"^(?:(?:the|this) (?:image|picture|scene) (?:shows|contains|has|depicts)|there (?:is|are)|i see|it shows)\s+"
)


def normalize_caption(text: str) -> str | None:
    """A caption's canonical text (`caption(parse_prompt(text))`), or None when it does not parse."""
    from mmreward.synthetic.captions import PromptParseError, parse_prompt

    t = re.sub(r"\s+", " ", text.lower().strip().rstrip(".").strip())
    t = _CAPTION_PREFIX.sub("", t)
    try:
        return caption(parse_prompt(t))
    except PromptParseError:
        return None


def scene_caption(scene: Scene) -> str:
    """The canonical caption of everything in a scene: colours named when at most two kinds of object."""
    groups = Counter((o.shape, o.color) for o in scene.objects)
    if len(groups) <= 2:
        clauses = tuple(ObjectClause(s, n, c) for (s, c), n in groups.items())
    else:  # e.g. three circles of three colours: parse_prompt reads at most two phrases
        by_shape = Counter(o.shape for o in scene.objects)
        clauses = tuple(ObjectClause(s, n) for s, n in by_shape.items())
    return caption(PromptSpec(classify(clauses, None), clauses))


# ----------------------------------------------------------------------------------------------
# questions
# ----------------------------------------------------------------------------------------------
def _questions_for_scene(scene: Scene, rng: random.Random) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """Every single-image question the scene supports: (kind, question, answer, colour-shape pairs involved)."""
    objs = scene.objects
    shapes = Counter(o.shape for o in objs)
    colors = Counter(o.color for o in objs)
    out = []
    # mostly a shape that is there (counts 1-4), sometimes one that is not (count 0)
    shape = rng.choice(sorted(shapes)) if rng.random() < 0.8 else rng.choice(SHAPES)
    n = shapes.get(shape, 0)
    pairs = [(o.color, o.shape) for o in objs if o.shape == shape]
    out.append(("count", f"How many {PLURALS[shape]} are there?", str(n), pairs))
    unique_shapes = [o for o in objs if shapes[o.shape] == 1]
    if unique_shapes:
        o = rng.choice(unique_shapes)
        out.append(("color", f"What colour is the {o.shape}?", o.color, [(o.color, o.shape)]))
    unique_colors = [o for o in objs if colors[o.color] == 1]
    if unique_colors:
        o = rng.choice(unique_colors)
        out.append(("shape", f"What shape is the {o.color} object?", o.shape, [(o.color, o.shape)]))
    distinct = [o for o in objs if sum((p.shape, p.color) == (o.shape, o.color) for p in objs) == 1]
    if len(distinct) >= 2:
        a, b = rng.sample(distinct, 2)
        truth = {r: relation_holds(r, (a.x, a.y), (a.size, a.size), (b.x, b.y), (b.size, b.size)) for r in RELATIONS}
        # yes and no equally often (a fixed relation would answer "no" about three times in four)
        want = rng.random() < 0.5
        rel = rng.choice([r for r in RELATIONS if truth[r] == want] or list(RELATIONS))
        holds = truth[rel]
        q = f"Is the {a.color} {a.shape} {rel} the {b.color} {b.shape}?"
        out.append(("position", q, "yes" if holds else "no", [(a.color, a.shape), (b.color, b.shape)]))
    out.append(("caption", CAPTION_QUESTION, scene_caption(scene), [(o.color, o.shape) for o in objs]))
    return out


def _which_question(a: Scene, b: Scene, rng: random.Random) -> tuple[str, str, str, list[tuple[str, str]]] | None:
    """'Which image shows the <colour> <shape>?' where exactly one of the two images shows one."""
    in_b = {(o.color, o.shape) for o in b.objects}
    in_a = {(o.color, o.shape) for o in a.objects}
    only_a = sorted(in_a - in_b)
    only_b = sorted(in_b - in_a)
    choices = [(p, "first") for p in only_a] + [(p, "second") for p in only_b]
    if not choices:
        return None
    (color, shape), answer = rng.choice(choices)
    q = f"Which image shows the {color} {shape}: the first or the second?"
    return "which", q, answer, sorted(in_a | in_b)


def is_held_out_question(kind: str, answer: str, pairs: Sequence[tuple[str, str]], shape: str | None = None) -> bool:
    """A question is held out when it involves a held-out colour-shape pair (asked about, answered or shown in
    a caption), or counts a held-out (count, shape) of the counting category."""
    if any(p in HELD_OUT_PAIRS for p in pairs):
        return True
    return kind == "count" and shape is not None and answer.isdigit() and (int(answer), shape) in HELD_OUT_COUNTS


def make_questions(
    n: int, seed: int = 0, split: str = "train", kinds: Sequence[str] = KINDS, pool_factor: int = 4
) -> list[VQAItem]:
    """n questions of `split`, the kinds in turn; the same arguments always give the same questions.

    Training questions come from training scenes, held-out ones from held-out scenes (`prompts.is_held_out`),
    and each split keeps only its side of `is_held_out_question`: no training question involves a held-out
    colour-shape pair (in the question, the answer or the caption), every held-out question does (or
    counts a held-out count).
    """
    if split not in SPLITS:
        raise RewardInputError(f"split: expected one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RewardInputError(f"n must be an int >= 1, got {n!r}")
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise RewardInputError(f"kinds: expected a non-empty subset of {KINDS}, got {list(kinds)}")
    rng = random.Random(f"vqa/{seed}/{split}")
    scenes = sample_scenes(max(pool_factor * n, 8), seed=seed, split=split)
    by_kind: dict[str, list[VQAItem]] = {k: [] for k in kinds}
    for i, scene in enumerate(scenes):
        found = [(*q, (scene,)) for q in _questions_for_scene(scene, rng)]
        if "which" in kinds:
            other = scenes[(i + 1) % len(scenes)]
            w = _which_question(scene, other, rng)
            if w is not None:
                found.append((*w, (scene, other)))
        for kind, question, answer, pairs, shown in found:
            if kind not in by_kind:
                continue
            # the two splits are disjoint by this rule, not only by the scenes they come from
            shape = question.split()[2] if kind == "count" else None
            count_shape = next((s for s, p in PLURALS.items() if p == shape), None)
            if is_held_out_question(kind, answer, pairs, count_shape) != (split == "heldout"):
                continue
            by_kind[kind].append(VQAItem(kind, question, answer, shown, split))
    out: list[VQAItem] = []
    cursor = dict.fromkeys(kinds, 0)
    while len(out) < n:
        progressed = False
        for kind in kinds:
            if len(out) == n:
                break
            if cursor[kind] < len(by_kind[kind]):
                out.append(by_kind[kind][cursor[kind]])
                cursor[kind] += 1
                progressed = True
        if not progressed:
            raise RewardInputError(f"only {len(out)} {split} questions of kinds {list(kinds)} from "
                                   f"{len(scenes)} scenes; raise pool_factor")
    return out


def item_images(item: VQAItem, size: int = 64) -> torch.Tensor:
    """The item's images, (K, 3, size, size) in [0, 1] (K = 2 for 'which' questions)."""
    return render(list(item.scenes), size=size)


# ----------------------------------------------------------------------------------------------
# trainer datasets
# ----------------------------------------------------------------------------------------------
def _pil(images: torch.Tensor) -> list[Any]:
    from PIL import Image

    arr = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arr]


def prompt_text(item: VQAItem, answer_format: bool = True) -> str:
    return f"{item.question} {ANSWER_FORMAT}" if answer_format else item.question


def render_grouped(items: Sequence[VQAItem], size: int = 64, chunk: int = 256) -> list[list[Any]]:
    """Every item's images as PIL images, the scenes rendered in batches of `chunk` (faster than per item)."""
    scenes = [s for item in items for s in item.scenes]
    pils = _pil(torch.cat([render(scenes[i:i + chunk], size=size) for i in range(0, len(scenes), chunk)]))
    out, start = [], 0
    for item in items:
        out.append(pils[start:start + len(item.scenes)])
        start += len(item.scenes)
    return out


def to_trl_rows(items: Sequence[VQAItem], size: int = 64, answer_format: bool = True,
                images: Sequence[Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """Rows for trl's GRPOTrainer (conversational VLM format): one {"type": "image"} placeholder per image in
    the user turn, PIL images in "images" (trl fills the placeholders in order), and "answer", "kind",
    "question" columns that trl passes to reward functions as keyword arguments.

    images: the items' PIL images when already rendered (`render_grouped(items, size)`)."""
    if images is not None and len(images) != len(items):
        raise RewardInputError(f"images: expected one list of images per item ({len(items)}), got {len(images)}")
    rendered = list(images) if images is not None else render_grouped(items, size)
    rows = []
    for item, pics in zip(items, rendered):
        content = [{"type": "image"} for _ in pics] + [{"type": "text", "text": prompt_text(item, answer_format)}]
        rows.append({"prompt": [{"role": "user", "content": content}], "images": list(pics), "answer": item.answer,
                     "kind": item.kind, "question": item.question})
    return rows


def to_verl_rows(
    items: Sequence[VQAItem], image_dir: str | Path, size: int = 64, answer_format: bool = True,
    data_source: str = "mmreward/shapes-vqa",
) -> list[dict[str, Any]]:
    """Rows for verl's RLHFDataset (the multimodal layout of its geo3k example): "prompt" messages whose
    content holds one "<image>" token per image, "images" as [{"image": path}], "reward_model":
    {"style": "rule", "ground_truth": answer}. verl's reward functions never see the images, so
    extra_info also carries the paths as an mmreward media reference, plus the question and kind."""
    from vlm_rm.adapters.media_refs import MEDIA_KEY

    out_dir = Path(image_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, item in enumerate(items):
        paths = []
        for j, image in enumerate(_pil(item_images(item, size))):
            path = out_dir / f"{item.split}_{i:06d}_{j}.png"
            image.save(path)
            paths.append(str(path))
        text = "<image>" * len(paths) + prompt_text(item, answer_format)
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": text}],
            "images": [{"image": p} for p in paths],
            "ability": "vqa",
            "reward_model": {"style": "rule", "ground_truth": item.answer},
            "extra_info": {"index": i, "split": item.split, "kind": item.kind, "question": item.question,
                           MEDIA_KEY: paths},
        })
    return rows
