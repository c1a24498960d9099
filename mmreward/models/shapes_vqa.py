"""shapes-vqa: the exact checker of answers to ShapesWorld questions (no weights), a ResponseReward.

`score_responses(questions, images, responses, references=None)` gives 1 for a correct answer, 0 otherwise:
1. the question's kind is read from its text (the templates of `mmreward.synthetic.vqa`; an empty question
   or "Describe the image ..." is a caption request);
2. the answer is the last <answer>...</answer> span of the response, else the whole response, and is
   normalised (`vqa.normalize_answer`: "There are 3 circles." -> "3", "three" -> "3", "crimson" -> "red");
   no answer, or several different ones ("red or blue"), is wrong;
3. the truth is the item's reference answer when given, else it is read off the image by ShapesWorld's
   exact analytic detector (so a dataset without answers still scores). "Which image ..." questions span
   two images and need the reference. A caption is parsed with `captions.parse_prompt` and its clauses
   checked on the image by the exact checker (GenEval's rules), and it must name every object detected
   (so "a circle" does not pass for three circles and a square).
details: kind (index into vqa.KINDS), format_ok (the <answer> tag was used), parsed (an answer was read),
correct. rationales: "kind=count answer=3 truth=3" per item.
`score(texts, images)` (the plain Reward contract) checks each text as a caption of its image.
"""

from __future__ import annotations

import re

import torch

from mmreward.errors import RewardInputError
from mmreward.types import ResponseReward, RewardOutput

_QUESTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("count", re.compile(r"^how many (?P<shape>[a-z ]+?) are there$")),
    ("color", re.compile(r"^what colou?r is the (?P<shape>[a-z]+)$")),
    ("shape", re.compile(r"^what shape is the (?P<color>[a-z]+) (?:object|shape|thing)$")),
    ("position", re.compile(r"^is the (?P<ca>[a-z]+) (?P<sa>[a-z]+) (?:to the )?(?P<rel>left of|right of|above|below) "
                            r"the (?P<cb>[a-z]+) (?P<sb>[a-z]+)$")),
    ("which", re.compile(r"^which image (?:shows|has|contains) the (?P<color>[a-z]+) (?P<shape>[a-z]+)\b.*$")),
    ("caption", re.compile(r"^(?:describe|caption)\b.*$")),
)


def parse_question(question: str) -> tuple[str, dict[str, str]]:
    """(kind, slots) of a ShapesWorld question; "" is a caption request. Raises RewardInputError otherwise."""
    from mmreward.synthetic.vqa import ANSWER_FORMAT, COLOR_SYNONYMS, SHAPE_WORDS

    text = question.replace(ANSWER_FORMAT, " ")
    text = re.split(r"\banswer with\b", text.lower())[0]
    text = re.sub(r"\s+", " ", text).strip().rstrip("?.").strip()
    if not text:
        return "caption", {}
    for kind, pattern in _QUESTION_PATTERNS:
        m = pattern.match(text)
        if m is None:
            continue
        slots = dict(m.groupdict())
        try:
            for key in ("shape", "sa", "sb"):
                if key in slots:
                    slots[key] = SHAPE_WORDS[slots[key]]
            for key in ("color", "ca", "cb"):
                if key in slots:
                    slots[key] = COLOR_SYNONYMS[slots[key]]
        except KeyError as exc:
            raise RewardInputError(f"question {question!r}: {exc.args[0]!r} is not a ShapesWorld shape or colour") from None
        return kind, slots
    raise RewardInputError(
        f"question {question!r} is not a ShapesWorld question; shapes-vqa reads the templates of "
        "mmreward.synthetic.vqa ('How many circles are there?', 'What colour is the triangle?', 'What shape is "
        "the red object?', 'Is the red circle left of the blue square?', 'Which image shows the red circle: ...', "
        "'Describe the image ...')"
    )


def _unique(values: list[str]) -> str | None:
    return values[0] if len(values) == 1 else None


def _truth_from_image(kind: str, slots: dict[str, str], objs: list[tuple[str, str, tuple, tuple]]) -> str | None:
    """The answer read off one image's detections [(shape, colour, centre, size)]; None when it has none."""
    from mmreward.synthetic.checker import relation_holds

    if kind == "count":
        return str(sum(s == slots["shape"] for s, _, _, _ in objs))
    if kind == "color":
        return _unique([c for s, c, _, _ in objs if s == slots["shape"]])
    if kind == "shape":
        return _unique([s for s, c, _, _ in objs if c == slots["color"]])
    if kind == "position":
        a = [o for o in objs if (o[0], o[1]) == (slots["sa"], slots["ca"])]
        b = [o for o in objs if (o[0], o[1]) == (slots["sb"], slots["cb"])]
        if len(a) != 1 or len(b) != 1:
            return None
        holds = relation_holds(slots["rel"], a[0][2], a[0][3], b[0][2], b[0][3])
        return "yes" if holds else "no"
    raise RewardInputError(f"a '{kind}' question needs its reference answer: pass references= (the dataset's "
                           "'answer' column); one image cannot tell which of two images is meant")


class ShapesVQAReward(ResponseReward):
    name = "shapes-vqa"
    differentiable = False

    def _score_responses(self, questions, media, responses, references):
        from mmreward.synthetic.checker import check, detect
        from mmreward.synthetic.prompts import COLORS, SHAPES
        from mmreward.synthetic.vqa import KINDS, extract_answer, normalize_answer

        if isinstance(media, list):  # items of different sizes: one by one
            return RewardOutput.concat([
                self._score_responses([q], m[None], [r], [ref])
                for q, m, r, ref in zip(questions, media, responses, references)
            ])
        parsed_questions = [parse_question(q) for q in questions]
        # the detector runs only on the images whose truth it decides (captions, answers without a reference):
        # given references, a GRPO batch of short answers is checked without it
        need = [i for i, ((kind, _), ref) in enumerate(zip(parsed_questions, references))
                if kind == "caption" or ref is None]
        row = {i: j for j, i in enumerate(need)}
        det = detect(media[need, :3]) if need else None
        objs: list[list[tuple[str, str, tuple, tuple]]] = [[] for _ in range(len(responses))]
        if det is not None:
            for b, s, c, center, size in zip(det.image.tolist(), det.shape.tolist(), det.color.tolist(),
                                             det.center.tolist(), det.size.tolist()):
                objs[need[b]].append((SHAPES[s], COLORS[c], tuple(center), tuple(size)))
        kinds, fmt, parsed, correct, why = [], [], [], [], []
        for i, ((kind, slots), response, reference) in enumerate(zip(parsed_questions, responses, references)):
            span, format_ok = extract_answer(response)
            answer = normalize_answer(kind, span)
            if kind == "caption":
                # the image is the ground truth: the clauses hold on it and the caption names every object
                ok = False
                if answer is not None:
                    from mmreward.synthetic.captions import parse_prompt

                    spec = parse_prompt(answer)
                    mine = det.for_image(row[i])
                    mine.image = torch.zeros_like(mine.image)  # its own batch of one
                    holds = bool(check([spec], mine).strict[0])
                    ok = holds and spec.num_objects == len(objs[i])
                truth = "<checked on the image>"
            else:
                truth = normalize_answer(kind, reference) if reference is not None else _truth_from_image(kind, slots, objs[i])
                ok = answer is not None and truth is not None and answer == truth
            kinds.append(float(KINDS.index(kind)))
            fmt.append(float(format_ok))
            parsed.append(float(answer is not None))
            correct.append(float(ok))
            why.append(f"kind={kind} answer={answer} truth={truth}")
        scores = torch.tensor(correct)
        details = {"kind": torch.tensor(kinds), "format_ok": torch.tensor(fmt), "parsed": torch.tensor(parsed),
                   "correct": scores.clone()}
        return RewardOutput(scores, details, why)


def load_shapes_vqa(checkpoint=None, *, weights="pretrained", **options) -> ShapesVQAReward:
    return ShapesVQAReward(**options)
