"""Moving ShapesWorld: short clips of one or two shapes moving in a stated direction and speed, with an exact checker.

A `MotionSpec` is one or two `MotionClause`s: shape, colour, direction (left/right/up/down), speed in pixels
per frame and an optional second colour the object turns into halfway through the clip ("a red circle moving
left at 2 pixels per frame and turning blue"). Colour changes are a step at frame T // 2 rather than a blend
so that every frame stays inside the palette and the per-frame colour is exact.

Rendering reuses ShapesWorld's scene renderer frame by frame; objects move by whole pixels per frame, so
every frame is the first one translated by an integer number of pixels (the supersampling grid shifts with
it) and the box centres move exactly `speed` pixels per frame.

Two-object clips keep both objects on one axis (both horizontal or both vertical), each in its own lane
(top/bottom half for horizontal motion, left/right half for vertical), so they never touch; their shapes
must differ, which lets the checker track each object by shape alone while its colour changes.

The checker runs ShapesWorld's analytic detector on every frame, then per object: `object` (exactly one
detection of its shape in every frame), `color` (the expected colour in every frame), `motion` (the least
squares slope of its box-centre track, from the one detection of each frame for a one-object clip whatever its
shape is read as, from the detections of its shape for two objects: along the stated axis within
`SPEED_TOLERANCE` of the stated speed in the stated sign, across it within the same tolerance of 0); plus one `count` clause (every frame holds exactly
the number of objects asked for).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from mmreward.errors import RewardInputError
from mmreward.synthetic.captions import PLURALS, SYNONYMS, PromptParseError
from mmreward.synthetic.prompts import COLORS, SHAPES, PromptSpec
from mmreward.synthetic.scenes import Scene, SceneObject, render

DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
SPEEDS: tuple[int, ...] = (1, 2)  # pixels per frame; at 8 frames x 32 px, 2 px/frame crosses 44% of the image
DEFAULT_FRAMES = 8
DEFAULT_SIZE = 32
SINGLE_SIZE = (0.38, 0.46)  # object side / image side with one object (below ~10 px small blue circles read as squares)
LANE_SIZE = (0.34, 0.40)  # the same for two objects, each in a half-image lane
MARGIN_PX = 1.0  # minimum gap in pixels between an object and the image border over the whole clip
SPEED_TOLERANCE = 0.25  # pixels per frame; renders are exact, so this only absorbs a generator's wobble
# the soft score's motion term: exp(-(e / SOFT_SPEED_SCALE)^2) with e the larger axis error of the fitted velocity
# in pixels per frame, so a still object asked to move 1 px/frame gets 0.37 and the wrong way gets 0.02 (a dense
# signal for RL where the pass/fail clause gives every sample of a group 0)
SOFT_SPEED_SCALE = 1.0
MOTION_CLAUSE_KINDS: tuple[str, ...] = ("object", "color", "motion", "count")


@dataclass(frozen=True)
class MotionClause:
    shape: str
    color: str
    direction: str
    speed: int = 1
    end_color: str | None = None  # colour from frame T // 2 on

    def color_at(self, frame: int, num_frames: int) -> str:
        return self.end_color if self.end_color is not None and frame >= num_frames // 2 else self.color


@dataclass(frozen=True)
class MotionSpec:
    objects: tuple[MotionClause, ...]

    @property
    def num_objects(self) -> int:
        return len(self.objects)


@dataclass(frozen=True)
class Clip:
    """A moving scene: the spec, the first frame's objects (centre and size as image fractions) and the size."""

    spec: MotionSpec
    start: tuple[SceneObject, ...]
    num_frames: int
    size: int

    def frame_scene(self, t: int) -> Scene:
        objs = []
        for clause, o in zip(self.spec.objects, self.start):
            dx, dy = DIRECTIONS[clause.direction]
            step = clause.speed * t / self.size
            objs.append(SceneObject(o.shape, clause.color_at(t, self.num_frames), o.x + dx * step, o.y + dy * step,
                                    o.size))
        # scenes carry an image prompt spec; a placeholder is enough for rendering
        return Scene(tuple(objs), PromptSpec("single_object", ()))


# ----------------------------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------------------------
def _clause_text(c: MotionClause) -> str:
    unit = "pixel" if c.speed == 1 else "pixels"
    text = f"a {c.color} {c.shape} moving {c.direction} at {c.speed} {unit} per frame"
    return text + (f" and turning {c.end_color}" if c.end_color else "")


def motion_caption(spec: MotionSpec) -> str:
    """The canonical prompt of a spec, e.g. 'a red circle moving left at 1 pixel per frame and turning blue'."""
    return " and ".join(_clause_text(c) for c in spec.objects)


_SHAPE_WORDS = {**{s: s for s in SHAPES}, **{p: s for s, p in PLURALS.items()}, **SYNONYMS}
_COLOR = "|".join(COLORS)
_CLAUSE = re.compile(
    r"^(?:a|an|one)\s+(?P<color>" + _COLOR + r")\s+"
    r"(?P<shape>" + "|".join(sorted(map(re.escape, _SHAPE_WORDS), key=len, reverse=True)) + r")\s+"
    r"(?:moving|going|travelling|traveling)\s+(?:to the\s+)?(?P<dir>left|right|up|down)(?:wards?)?"
    r"(?:\s+at\s+(?P<speed>\d+)\s+(?:pixels?|px)\s+(?:per|a|an|each)\s+frame)?"
    r"(?:\s*,?\s+(?:and\s+)?turning\s+(?P<end>" + _COLOR + r"))?$"
)
# a new object starts at "and a/an/one <colour>"; "and turning ..." stays inside its clause
_SPLIT = re.compile(r"\s*,?\s+and\s+(?=(?:a|an|one)\s+(?:" + _COLOR + r")\b)")
_PREFIX = re.compile(r"^(?:a|an)\s+(?:video|clip|animation)\s+of\s+")


def parse_motion_prompt(text: str) -> MotionSpec:
    """The spec of a moving-shapes prompt; raises PromptParseError (a RewardInputError) for anything else."""
    if not isinstance(text, str):
        raise PromptParseError(f"prompt: expected a string, got {type(text).__name__}")
    t = re.sub(r"\s+", " ", text.lower().strip().rstrip(".").strip())
    t = _PREFIX.sub("", t)
    parts = _SPLIT.split(t)
    if len(parts) > 2:
        raise PromptParseError(f"prompt {text!r}: moving-shapes prompts name at most two objects")
    clauses = []
    for part in parts:
        m = _CLAUSE.match(part)
        if not m:
            raise PromptParseError(
                f"prompt {text!r}: cannot read {part!r}. Moving-shapes phrases look like 'a red circle moving left "
                f"[at 2 pixels per frame] [and turning blue]' with shapes {list(SHAPES)}, colours {list(COLORS)} "
                f"and directions {list(DIRECTIONS)}."
            )
        speed = int(m.group("speed") or 1)
        if speed not in SPEEDS:
            raise PromptParseError(f"prompt {text!r}: speed must be one of {list(SPEEDS)} pixels per frame, got {speed}")
        end = m.group("end")
        if end == m.group("color"):
            raise PromptParseError(f"prompt {text!r}: 'turning {end}' must name a colour other than the first")
        clauses.append(MotionClause(_SHAPE_WORDS[m.group("shape")], m.group("color"), m.group("dir"), speed, end))
    if len(clauses) == 2:
        a, b = clauses
        if a.shape == b.shape:
            raise PromptParseError(f"prompt {text!r}: the two objects must be different shapes (they are tracked by shape)")
        if _axis(a.direction) != _axis(b.direction):
            raise PromptParseError(
                f"prompt {text!r}: two objects must move along the same axis (both left/right or both up/down)"
            )
    return MotionSpec(tuple(clauses))


def _axis(direction: str) -> int:
    return 0 if DIRECTIONS[direction][0] else 1


def all_motion_specs(speeds: tuple[int, ...] = SPEEDS) -> list[MotionSpec]:
    """Every one-object spec (shape x colour x direction x speed x optional colour change), in a fixed order."""
    out = []
    for shape in SHAPES:
        for color in COLORS:
            for direction in DIRECTIONS:
                for speed in speeds:
                    for end in (None, *[c for c in COLORS if c != color]):
                        out.append(MotionSpec((MotionClause(shape, color, direction, speed, end),)))
    return out


# ----------------------------------------------------------------------------------------------
# sampling and rendering
# ----------------------------------------------------------------------------------------------
def _check_fits(lo: float, hi: float, travel: float) -> None:
    if travel > hi - lo:
        raise RewardInputError(
            f"the clip is too long or too fast for the image: an object travels {travel:.2f} of the image side "
            f"but only {hi - lo:.2f} is free; use fewer frames, a lower speed or a larger size"
        )


def _travel_range(lo: float, hi: float, sign: int, travel: float, rng: random.Random) -> float:
    """A start coordinate in [lo, hi] such that start + sign * travel stays in [lo, hi]."""
    _check_fits(lo, hi, travel)
    start = rng.uniform(lo, hi - travel)
    return start if sign > 0 else start + travel


def realize_clip(spec: MotionSpec, rng: random.Random, num_frames: int = DEFAULT_FRAMES,
                 size: int = DEFAULT_SIZE, centred: bool = False) -> Clip:
    """A random clip satisfying `spec`: sizes and start positions drawn so every object stays inside its lane.

    centred: one-object clips take the middle size and travel symmetrically about the image centre, so the clip
    is a function of the spec alone (the layout the shipped video generator is fine-tuned on: see its card)."""
    if num_frames < 2:
        raise RewardInputError(f"num_frames must be >= 2 to show motion, got {num_frames}")
    if centred and spec.num_objects != 1:
        raise RewardInputError("centred clips hold one object; two objects keep their random lanes")
    margin = MARGIN_PX / size
    start = []
    two = spec.num_objects == 2
    for k, clause in enumerate(spec.objects):
        s = sum(SINGLE_SIZE) / 2 if centred else rng.uniform(*(LANE_SIZE if two else SINGLE_SIZE))
        s = round(s * size) / size  # whole-pixel sizes keep every object's box on the pixel grid
        dx, dy = DIRECTIONS[clause.direction]
        travel = clause.speed * (num_frames - 1) / size
        lo, hi = s / 2 + margin, 1 - s / 2 - margin
        if centred:
            _check_fits(lo, hi, travel)
            along = 0.5 - (dx + dy) * travel / 2
        else:
            along = _travel_range(lo, hi, dx + dy, travel, rng)
        if two:  # the lane across the motion: half k of the image
            cross = k * 0.5 + rng.uniform(s / 2 + margin, 0.5 - s / 2 - margin)
        else:
            cross = 0.5 if centred else 0.5 + rng.uniform(-0.1, 0.1)
        # whole-pixel starts: translation by whole pixels keeps the rendered frames exact shifts of each other
        along, cross = round(along * size) / size, round(cross * size * 2) / (size * 2)
        x, y = (along, cross) if dx else (cross, along)
        start.append(SceneObject(clause.shape, clause.color, x, y, s))
    return Clip(spec, tuple(start), num_frames, size)


def render_clips(clips: list[Clip], supersample: int = 4) -> torch.Tensor:
    """Render clips of equal length and size to a float (B, T, 3, H, W) batch in [0, 1]."""
    if not clips:
        raise RewardInputError("clips: got an empty list; pass at least one Clip")
    shapes = {(c.num_frames, c.size) for c in clips}
    if len(shapes) != 1:
        raise RewardInputError(f"clips: every clip needs the same frame count and size to batch, got {sorted(shapes)}")
    num_frames, size = shapes.pop()
    scenes = [c.frame_scene(t) for c in clips for t in range(num_frames)]
    return render(scenes, size=size, supersample=supersample).view(len(clips), num_frames, 3, size, size)


# ----------------------------------------------------------------------------------------------
# checking
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MotionClauseResult:
    kind: str  # one of MOTION_CLAUSE_KINDS
    text: str
    passed: bool
    closeness: float | None = None  # motion only: exp(-(error / SOFT_SPEED_SCALE)^2), 0 when not trackable

    @property
    def soft(self) -> float:
        return float(self.passed) if self.closeness is None else self.closeness


@dataclass
class MotionCheckResult:
    strict: torch.Tensor  # (B,) 1 when every clause holds
    partial: torch.Tensor  # (B,) fraction of clauses that hold
    soft: torch.Tensor  # (B,) partial with the motion clauses scored by closeness (MotionClauseResult.closeness)
    motion_soft: torch.Tensor  # (B,) mean closeness of the motion clauses alone
    by_kind: dict[str, torch.Tensor]  # fraction of clauses of each kind that hold
    clauses: list[list[MotionClauseResult]]


def fit_velocity(track: torch.Tensor) -> torch.Tensor:
    """Least-squares slope (pixels per frame) of a (T, 2) track of positions over frames 0..T-1."""
    t = torch.arange(track.shape[0], dtype=torch.float64)
    tc = t - t.mean()
    pos = track.to(torch.float64)
    return (tc[:, None] * (pos - pos.mean(0))).sum(0) / (tc * tc).sum()


def motion_matches(velocity: torch.Tensor, direction: str, speed: float, tol: float = SPEED_TOLERANCE) -> bool:
    """Velocity (vx, vy) in pixels per frame (y down) moves `direction` at `speed` within `tol` on both axes."""
    dx, dy = DIRECTIONS[direction]
    expected = torch.tensor([dx * speed, dy * speed], dtype=torch.float64)
    return bool(((velocity.to(torch.float64) - expected).abs() <= tol).all())


def check_clip(spec: MotionSpec, per_frame: list[list[dict]], width: int, height: int) -> list[MotionClauseResult]:
    """Clause results of one clip from its per-frame detections ({'label', 'color', 'box'} dicts)."""
    n = len(per_frame)
    out = []
    for c in spec.objects:
        mine = [[d for d in dets if d["label"] == c.shape] for dets in per_frame]
        single = all(len(m) == 1 for m in mine)
        out.append(MotionClauseResult("object", f"exactly one {c.shape} in every frame", single))
        colours_ok = single and all(m[0]["color"] == c.color_at(t, n) for t, m in enumerate(mine))
        colour_text = c.color + (f" then {c.end_color}" if c.end_color else "")
        out.append(MotionClauseResult("color", f"{c.shape} is {colour_text}", colours_ok))
        moving, closeness = False, 0.0
        # a lone object is tracked whatever shape it is read as, so `motion` measures motion and not the shape
        # again (`object` does that); two objects need their shapes to tell the tracks apart
        track_dets = per_frame if spec.num_objects == 1 else mine
        if all(len(m) == 1 for m in track_dets):
            boxes = torch.tensor([m[0]["box"] for m in track_dets], dtype=torch.float64)
            track = torch.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2], 1)
            velocity = fit_velocity(track)
            moving = motion_matches(velocity, c.direction, c.speed)
            dx, dy = DIRECTIONS[c.direction]
            error = (velocity - torch.tensor([dx * c.speed, dy * c.speed], dtype=torch.float64)).abs().max()
            closeness = float(torch.exp(-((error / SOFT_SPEED_SCALE) ** 2)))
        out.append(MotionClauseResult("motion", f"{c.shape} moves {c.direction} at {c.speed} px/frame", moving,
                                      closeness))
    count_ok = all(len(dets) == spec.num_objects for dets in per_frame)
    out.append(MotionClauseResult("count", f"exactly {spec.num_objects} object(s) in every frame", count_ok))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def check_clips(specs: list[MotionSpec], videos: torch.Tensor) -> MotionCheckResult:
    """Check a float (B, T, 3, H, W) batch in [0, 1] against one spec per clip."""
    from mmreward.synthetic.checker import detect

    if videos.ndim != 5 or videos.shape[2] != 3:
        raise RewardInputError(f"videos: expected a (B, T, 3, H, W) tensor, got shape {tuple(videos.shape)}")
    b, n, _, h, w = videos.shape
    if len(specs) != b:
        raise RewardInputError(f"specs and videos must have the same length: got {len(specs)} specs for {b} videos")
    if n < 2:
        raise RewardInputError(f"videos: need at least 2 frames to check motion, got {n}")
    dets = detect(videos.reshape(b * n, 3, h, w)).to_dicts()
    results = [check_clip(spec, dets[i * n:(i + 1) * n], w, h) for i, spec in enumerate(specs)]
    strict = torch.tensor([float(all(r.passed for r in res)) for res in results])
    partial = torch.tensor([sum(r.passed for r in res) / len(res) for res in results])
    soft = torch.tensor([sum(r.soft for r in res) / len(res) for res in results])
    motion_soft = torch.tensor([_mean([r.soft for r in res if r.kind == "motion"]) for res in results])
    by_kind = {kind: torch.tensor([_mean([float(r.passed) for r in res if r.kind == kind]) for res in results])
               for kind in MOTION_CLAUSE_KINDS}
    return MotionCheckResult(strict, partial, soft, motion_soft, by_kind, results)


# ----------------------------------------------------------------------------------------------
# splits
# ----------------------------------------------------------------------------------------------
def motion_is_held_out(spec: MotionSpec) -> bool:
    """True when an object starts or ends as one of ShapesWorld's held-out colour-shape pairs (never trained on)."""
    from mmreward.synthetic.prompts import HELD_OUT_PAIRS

    return any((c.color, c.shape) in HELD_OUT_PAIRS or (c.end_color, c.shape) in HELD_OUT_PAIRS for c in spec.objects)


def motion_specs_for_split(split: str, speeds: tuple[int, ...] = SPEEDS) -> list[MotionSpec]:
    """Every one-object spec of `split` ('train', 'heldout' or 'all'), in all_motion_specs' order."""
    if split not in ("train", "heldout", "all"):
        raise RewardInputError(f"split: expected 'train', 'heldout' or 'all', got {split!r}")
    return [s for s in all_motion_specs(speeds) if split == "all" or motion_is_held_out(s) == (split == "heldout")]
