"""GenEval's clause checking and Flow-GRPO's GenEval reward, from one image's detections.

Three quantities, each as its original computes it (read at djghosh13/geneval@af4902f
`evaluation/evaluate_images.py` and yifan123/reward-server@92ac29f `reward_server/gen_eval.py`):

- `accuracy` (GenEval's `correct`, `evaluate`): every include clause finds at least `count` objects,
  the `count` most confident of them all have the asked colour and all stand in the asked relation
  to every object of the target clause; exclude clauses (counting prompts: count + 1 of the class)
  fail when that many objects are found.
- `strict` (Flow-GRPO's `strict_correct`, `evaluate_reward`): the same with exact counts (`==`) for
  every clause, colour counts exact too; exclude clauses are not consulted.
- `score` (Flow-GRPO's dense training reward, `evaluate_reward`): the mean of per-clause terms:
  `1 - |count - found| / count` for every include clause (negative once found > 2 count, as in the
  original), then, for a clause with colour or position: 0 when the count is off; else the colour
  term `1 - |count - of_colour| / count`, and the position term 0 (no target), or 1 (all hold), or
  0 and 1 (a relation fails: the original appends 0, breaks, then appends 1 unconditionally).

Objects (`select_objects`, both originals' `evaluate_image`): per class, detections with score
strictly above 0.3 (0.9 on counting prompts), the 16 most confident, then greedy NMS at IoU 1.0
(i.e. none). A clause asking for zero objects divides by zero in Flow-GRPO's reward; here its terms
are 1 when no object is found, else 0 (GenEval's accuracy passes it, as the original does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mmreward.errors import ConfigError
from mmreward.geneval import Detection
from mmreward.geneval.prompt_parser import CompositionSpec, ObjectClause

# classify(objects, classname) -> one colour name per object, for the image being evaluated
ColorFn = Callable[[Sequence[Detection], str], list[str]]


@dataclass(frozen=True)
class Thresholds:
    score: float = 0.3
    counting_score: float = 0.9
    max_objects: int = 16
    position_margin: float = 0.1
    max_overlap: float = 1.0  # GenEval's NMS_THRESHOLD ("max_overlap" option); 1.0 keeps every box

    def __post_init__(self) -> None:
        if not (0 <= self.score <= 1 and 0 <= self.counting_score <= 1):
            raise ConfigError(f"detection thresholds must be in [0, 1], got {self.score}, {self.counting_score}")
        if self.max_objects < 1 or self.position_margin < 0:
            raise ConfigError(f"max_objects must be >= 1 and position_margin >= 0, got {self.max_objects}, {self.position_margin}")
        if not 0 < self.max_overlap <= 1:
            raise ConfigError(f"max_overlap (NMS IoU) must be in (0, 1], got {self.max_overlap}")


@dataclass
class Evaluation:
    accuracy: bool  # GenEval's `correct`
    strict: bool  # Flow-GRPO's `strict_correct`
    score: float  # Flow-GRPO's dense `score`
    reasons: list[str] = field(default_factory=list)  # GenEval's reasons for `accuracy`
    strict_reasons: list[str] = field(default_factory=list)  # Flow-GRPO's reasons for `strict`
    terms: list[float] = field(default_factory=list)  # the terms `score` averages

    def reason(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "all clauses satisfied"


def box_iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """GenEval's `compute_iou`: pixel-inclusive areas (+1 on each side)."""
    def area(b: Sequence[float]) -> float:
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)

    inter = area((max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])))
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0.0


def select_objects(detections: Sequence[Detection], counting: bool, thresholds: Thresholds = Thresholds()) -> dict[str, list[Detection]]:
    """Per class, the detections GenEval keeps, most confident first (classes with none are absent)."""
    min_score = thresholds.counting_score if counting else thresholds.score
    by_class: dict[str, list[Detection]] = {}
    for d in detections:
        by_class.setdefault(d.label, []).append(d)
    kept: dict[str, list[Detection]] = {}
    for name, dets in by_class.items():
        # strictly above the threshold, as the original's `> confidence_threshold`
        order = sorted((d for d in dets if d.score > min_score), key=lambda d: -d.score)[: thresholds.max_objects]
        chosen: list[Detection] = []
        while order:
            best = order.pop(0)
            chosen.append(best)
            if thresholds.max_overlap < 1:
                order = [d for d in order if box_iou(best.box, d.box) < thresholds.max_overlap]
        if chosen:
            kept[name] = chosen
    return kept


def relative_position(box_a: Sequence[float], box_b: Sequence[float], margin: float = 0.1) -> set[str]:
    """Relations of box A to box B ("left of", "right of", "above", "below"); image y grows downwards.

    The centre offset, shrunk on each axis by `margin` x the two boxes' summed sizes, divided by the
    unshrunk offset's length; a relation holds when its component passes 0.5 (60 degrees from the axis).
    """
    ca = ((box_a[0] + box_a[2]) / 2, (box_a[1] + box_a[3]) / 2)
    cb = ((box_b[0] + box_b[2]) / 2, (box_b[1] + box_b[3]) / 2)
    dims = (abs(box_a[2] - box_a[0]) + abs(box_b[2] - box_b[0]), abs(box_a[3] - box_a[1]) + abs(box_b[3] - box_b[1]))
    offset = (ca[0] - cb[0], ca[1] - cb[1])
    revised = [math.copysign(max(abs(o) - margin * d, 0.0), o) for o, d in zip(offset, dims)]
    if all(abs(r) < 1e-3 for r in revised):
        return set()
    norm = math.hypot(*offset)
    dx, dy = revised[0] / norm, revised[1] / norm
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


@dataclass(frozen=True)
class _Include:
    clause: ObjectClause
    position: tuple[str, int] | None = None  # (relation, index of the target include clause)


def geneval_includes(spec: CompositionSpec) -> list[_Include]:
    """The spec's include clauses in GenEval's metadata order: a relation's target comes first and the
    positioned object points back at it ("a cat left of a dog": [dog, cat with ("left of", 0)])."""
    if spec.relation is None:
        return [_Include(o) for o in spec.objects]
    return [_Include(spec.objects[1]), _Include(spec.objects[0], (spec.relation, 0))]


def _term(wanted: int, got: int) -> float:
    if wanted == 0:  # the original divides by zero here
        return 1.0 if got == 0 else 0.0
    return 1 - abs(wanted - got) / wanted


def _all_related(found: Sequence[Detection], targets: Sequence[Detection], relation: str, margin: float) -> bool:
    return all(relation in relative_position(a.box, b.box, margin) for a in found for b in targets)


def evaluate(
    spec: CompositionSpec,
    detections: Sequence[Detection],
    colors: ColorFn | None = None,
    thresholds: Thresholds = Thresholds(),
) -> Evaluation:
    """GenEval's accuracy and Flow-GRPO's strict and dense reward for one image's detections.

    `colors(objects, classname)` names each object's colour where a detection carries none (GenEval:
    CLIP zero-shot on the masked crop, `mmreward.geneval.clip_colors`)."""
    objects = select_objects(detections, spec.exact_count, thresholds)
    includes = geneval_includes(spec)
    cache: dict[tuple[str, tuple[int, ...]], list[str]] = {}

    def colors_of(found: list[Detection], name: str) -> list[str]:
        key = (name, tuple(id(d) for d in found))  # both quantities classify the same crops: once is enough
        if key not in cache:
            missing = [d for d in found if d.color is None]
            if missing and colors is None:
                raise ConfigError("a colour clause needs detections with colours or a colour classifier")
            named = iter(colors(missing, name) if missing else [])
            cache[key] = [d.color if d.color is not None else next(named) for d in found]
        return cache[key]

    margin = thresholds.position_margin
    # --- GenEval's `evaluate`: counts >=, only the `count` most confident objects are checked
    accuracy, reasons, groups = True, [], []
    for inc in includes:
        o, ok = inc.clause, True
        found = objects.get(o.name, [])[: o.count]
        if len(found) < o.count:
            ok = False
            reasons.append(f"expected {o.name}>={o.count}, found {len(found)}")
        else:
            if o.color is not None:
                n = colors_of(found, o.name).count(o.color)
                if n < o.count:
                    ok = False
                    reasons.append(f"expected {o.color} {o.name}>={o.count}, found {n} {o.color}")
            if inc.position is not None and ok:
                rel, target = inc.position
                if groups[target] is None:
                    ok = False
                    reasons.append(f"no target for {o.name} to be {rel}")
                elif not _all_related(found, groups[target], rel, margin):
                    ok = False
                    reasons.append(f"expected {o.name} {rel} target")
        accuracy = accuracy and ok
        groups.append(found if ok else None)
    if spec.exact_count:  # GenEval's counting rows exclude count + 1 of the class
        for inc in includes:
            n = len(objects.get(inc.clause.name, []))
            if n >= inc.clause.count + 1:
                accuracy = False
                reasons.append(f"expected {inc.clause.name}<{inc.clause.count + 1}, found {n}")

    # --- Flow-GRPO's `evaluate_reward`: counts ==, every kept object is checked, dense terms
    strict, strict_reasons, terms, groups = True, [], [], []
    for inc in includes:
        o, ok = inc.clause, True
        found = objects.get(o.name, [])
        terms.append(_term(o.count, len(found)))
        if len(found) != o.count:
            ok = False
            strict_reasons.append(f"expected {o.name}=={o.count}, found {len(found)}")
            if o.color is not None or inc.position is not None:
                terms.append(0.0)
        else:
            if o.color is not None:
                n = colors_of(found, o.name).count(o.color)
                terms.append(_term(o.count, n))
                if n != o.count:
                    ok = False
                    strict_reasons.append(f"expected {o.color} {o.name}=={o.count}, found {n} {o.color}")
            if inc.position is not None and ok:
                rel, target = inc.position
                if groups[target] is None:
                    ok = False
                    strict_reasons.append(f"no target for {o.name} to be {rel}")
                    terms.append(0.0)
                else:
                    if not _all_related(found, groups[target], rel, margin):
                        ok = False
                        strict_reasons.append(f"expected {o.name} {rel} target")
                        terms.append(0.0)
                    terms.append(1.0)  # the original appends 1 after its loop, also after a failure
        strict = strict and ok
        groups.append(found if ok else None)
    score = sum(terms) / len(terms) if terms else 0.0
    return Evaluation(accuracy, strict, score, reasons, strict_reasons, terms)
