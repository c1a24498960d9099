"""ShapesEval: an exact, analytic detector and GenEval-style clause checker for ShapesWorld images.

Detection, batched over images:
1. colour segmentation: each pixel is explained as background + alpha * (palette colour - background);
   the colour with the smallest residual wins and the pixel is foreground when its alpha > 0.5
   (this treats anti-aliased edges and blur as partial coverage instead of as a different colour);
2. connected components (8-neighbourhood, same colour) by iterated max-pooling of pixel indices;
3. shape classification: each component's mask is resampled to a 16x16 crop of its bounding box and
   compared (soft IoU) to templates of the four shapes drawn in the same normalised box.

Checking follows GenEval's rules (Ghosh et al. 2023): every object clause needs at least `count`
detections of its shape (exactly `count` for counting prompts), colour clauses need that many of the
right colour, and a relation compares box centres after discounting 10% of the two box sizes.
`strict` is 1 when every clause holds, `partial` the fraction that hold, and `soft` a dense variant
for reward shaping where each clause scores the template IoU of its best matching detections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmreward.errors import RewardInputError
from mmreward.synthetic.prompts import COLORS, SHAPES, PromptSpec
from mmreward.synthetic.scenes import BACKGROUND, PALETTE, Scene, shape_mask

TEMPLATE_SIZE = 16
MIN_AREA_FRACTION = 0.004  # components smaller than this fraction of the image are noise
POSITION_THRESHOLD = 0.1  # GenEval's margin: 10% of the summed box sizes
SHAPE_TEMPERATURE = 0.05  # IoU gaps between shapes are >= 0.2, so this makes the posterior near one-hot
CLAUSE_KINDS = ("object", "count", "color", "position")


@dataclass
class Detections:
    """Detected objects of a batch, one row per object; `image` says which image each row belongs to."""

    image: torch.Tensor  # (N,) long
    shape: torch.Tensor  # (N,) long, index into SHAPES
    color: torch.Tensor  # (N,) long, index into COLORS
    box: torch.Tensor  # (N, 4) x0, y0, x1, y1 in pixels (x1, y1 exclusive)
    center: torch.Tensor  # (N, 2) x, y as fractions of the image size
    size: torch.Tensor  # (N, 2) width, height as fractions of the image size
    area: torch.Tensor  # (N,) pixels
    shape_scores: torch.Tensor  # (N, len(SHAPES)) template IoU per shape; the detection score is the max
    batch_size: int

    @property
    def score(self) -> torch.Tensor:
        return self.shape_scores.max(dim=1).values

    @property
    def shape_probs(self) -> torch.Tensor:
        """A soft shape posterior from the template IoUs (temperature SHAPE_TEMPERATURE)."""
        return torch.softmax(self.shape_scores / SHAPE_TEMPERATURE, dim=1)

    def for_image(self, b: int) -> Detections:
        keep = self.image == b
        return Detections(
            self.image[keep], self.shape[keep], self.color[keep], self.box[keep], self.center[keep],
            self.size[keep], self.area[keep], self.shape_scores[keep], 1,
        )

    def to_dicts(self) -> list[list[dict]]:
        """Per image, a list of {'label', 'color', 'box', 'score'} dicts (the detector interface)."""
        out: list[list[dict]] = [[] for _ in range(self.batch_size)]
        for i in range(len(self.image)):
            out[int(self.image[i])].append({
                "label": SHAPES[int(self.shape[i])],
                "color": COLORS[int(self.color[i])],
                "box": [float(v) for v in self.box[i]],
                "score": float(self.shape_scores[i].max()),
            })
        return out


def _palette() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(BACKGROUND), torch.tensor([PALETTE[c] for c in COLORS])


def segment(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pixel: colour index (-1 = background) and coverage alpha, for a (B, 3, H, W) batch in [0, 1]."""
    bg, pal = _palette()
    bg, pal = bg.to(images), pal.to(images)
    diff = images - bg.view(1, 3, 1, 1)
    dirs = pal - bg  # (C, 3)
    alpha = torch.einsum("bchw,kc->bkhw", diff, dirs) / (dirs * dirs).sum(1).view(1, -1, 1, 1)
    alpha = alpha.clamp(0, 1)
    resid = (diff.unsqueeze(1) - alpha.unsqueeze(2) * dirs.view(1, -1, 3, 1, 1)).pow(2).sum(2)
    best = resid.argmin(1)
    a = alpha.gather(1, best.unsqueeze(1)).squeeze(1)
    return torch.where(a > 0.5, best, torch.full_like(best, -1)), a


def connected_components(labels: torch.Tensor) -> torch.Tensor:
    """Component id per pixel (0 = background): the largest 1-based pixel index in its component.

    Labels spread to 8-neighbours of the same colour, then jump along pointers (a pixel adopts the
    label of the pixel its label names), which makes the number of rounds logarithmic in practice.
    """
    b, h, w = labels.shape
    fg = labels >= 0
    idx = torch.arange(1, h * w + 1, device=labels.device).view(1, h, w)
    comp = torch.where(fg, idx, torch.zeros((), dtype=torch.long, device=labels.device))
    padded = F.pad(labels, (1, 1, 1, 1), value=-1)
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
    same = [
        (padded[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w] == labels) & fg for dy, dx in shifts
    ]
    flat_offset = (torch.arange(b, device=labels.device) * (h * w)).view(b, 1, 1)
    for _ in range(h * w):
        cp = F.pad(comp, (1, 1, 1, 1))
        grown = comp
        for (dy, dx), ok in zip(shifts, same):
            grown = torch.where(ok, torch.maximum(grown, cp[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]), grown)
        for _ in range(2):  # pointer jumping
            target = (grown - 1).clamp(min=0) + flat_offset
            grown = torch.where(fg, grown.flatten().gather(0, target.flatten()).view(b, h, w), grown)
        if torch.equal(grown, comp):
            break
        comp = grown
    return comp


@torch.no_grad()
def _templates(size: int = TEMPLATE_SIZE, supersample: int = 8) -> torch.Tensor:
    n = size * supersample
    c = (torch.arange(n, dtype=torch.float32) + 0.5) / n * 2 - 1
    ids = torch.arange(len(SHAPES)).view(-1, 1, 1)
    masks = shape_mask(ids, c.view(1, 1, n), c.view(1, n, 1)).float()
    return F.avg_pool2d(masks.unsqueeze(1), supersample).squeeze(1)  # (S, size, size)


@torch.no_grad()
def detect(images: torch.Tensor, min_area_fraction: float = MIN_AREA_FRACTION) -> Detections:
    """Detect coloured shapes in a float (B, 3, H, W) batch in [0, 1]."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise RewardInputError(f"images: expected a (B, 3, H, W) tensor, got shape {tuple(images.shape)}")
    images = images.float()
    bsz, _, h, w = images.shape
    labels, _ = segment(images)
    comp = connected_components(labels)
    fg = comp > 0
    key = torch.arange(bsz, device=images.device).view(-1, 1, 1) * (h * w + 1) + comp
    uniq, inv = torch.unique(key[fg], return_inverse=True)
    n = len(uniq)
    area = torch.bincount(inv, minlength=n).float()
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    xs = xs.expand(bsz, h, w)[fg].float()
    ys = ys.expand(bsz, h, w)[fg].float()
    x0 = torch.full((n,), float(w)).scatter_reduce(0, inv, xs, "amin")
    y0 = torch.full((n,), float(h)).scatter_reduce(0, inv, ys, "amin")
    x1 = torch.zeros(n).scatter_reduce(0, inv, xs, "amax") + 1
    y1 = torch.zeros(n).scatter_reduce(0, inv, ys, "amax") + 1
    color = torch.zeros(n, dtype=torch.long).scatter(0, inv, labels[fg])
    image = torch.div(uniq, h * w + 1, rounding_mode="floor")
    keep = area >= min_area_fraction * h * w
    # one binary mask per kept component, resampled to a box-normalised crop
    comp_index = torch.full((bsz, h, w), -1, dtype=torch.long)
    comp_index[fg] = inv
    kept = keep.nonzero().flatten()
    masks = (comp_index[image[kept]] == kept.view(-1, 1, 1)).float().unsqueeze(1)
    box = torch.stack([x0, y0, x1, y1], 1)[kept]
    cx = (box[:, 0] + box[:, 2]) / w - 1  # box centre in grid_sample's [-1, 1] coordinates
    cy = (box[:, 1] + box[:, 3]) / h - 1
    theta = torch.zeros(len(kept), 2, 3)
    theta[:, 0, 0] = (box[:, 2] - box[:, 0]) / w
    theta[:, 1, 1] = (box[:, 3] - box[:, 1]) / h
    theta[:, 0, 2], theta[:, 1, 2] = cx, cy
    if len(kept):
        grid = F.affine_grid(theta, [len(kept), 1, TEMPLATE_SIZE, TEMPLATE_SIZE], align_corners=False)
        crops = F.grid_sample(masks, grid, mode="bilinear", align_corners=False).squeeze(1)  # (N, R, R)
        tmpl = _templates()
        inter = torch.minimum(crops.unsqueeze(1), tmpl.unsqueeze(0)).sum((2, 3))
        union = torch.maximum(crops.unsqueeze(1), tmpl.unsqueeze(0)).sum((2, 3)).clamp(min=1e-6)
        shape_scores = inter / union
    else:  # a batch with no objects at all (a uniform image): nothing to match, every clause fails
        shape_scores = torch.zeros(0, len(SHAPES))
    size = torch.stack([(box[:, 2] - box[:, 0]) / w, (box[:, 3] - box[:, 1]) / h], 1)
    center = torch.stack([(box[:, 0] + box[:, 2]) / (2 * w), (box[:, 1] + box[:, 3]) / (2 * h)], 1)
    return Detections(
        image[kept], shape_scores.argmax(1), color[kept], box, center, size, area[kept], shape_scores, bsz
    )


def scene_detections(scenes: list[Scene]) -> Detections:
    """The ground-truth objects of scenes in the detection format (template scores one-hot)."""
    rows = [(b, o) for b, s in enumerate(scenes) for o in s.objects]
    image = torch.tensor([b for b, _ in rows], dtype=torch.long)
    shape = torch.tensor([SHAPES.index(o.shape) for _, o in rows], dtype=torch.long)
    color = torch.tensor([COLORS.index(o.color) for _, o in rows], dtype=torch.long)
    center = torch.tensor([(o.x, o.y) for _, o in rows], dtype=torch.float32).view(-1, 2)
    size = torch.tensor([(o.size, o.size) for _, o in rows], dtype=torch.float32).view(-1, 2)
    box = torch.cat([center - size / 2, center + size / 2], 1)
    return Detections(
        image, shape, color, box, center, size, size.prod(1), F.one_hot(shape, len(SHAPES)).float(), len(scenes)
    )


def relation_holds(relation: str, center_a, size_a, center_b, size_b) -> bool:
    """GenEval's relative position test on box centres (y grows downwards)."""
    revised, offset = [], []
    for ca, cb, sa, sb in zip(center_a, center_b, size_a, size_b):
        d = float(ca) - float(cb)
        offset.append(d)
        revised.append(math.copysign(max(abs(d) - POSITION_THRESHOLD * (float(sa) + float(sb)), 0.0), d))
    if all(abs(r) < 1e-3 for r in revised):
        return False
    norm = math.hypot(*offset)
    dx, dy = revised[0] / norm, revised[1] / norm
    return {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}[relation]


@dataclass(frozen=True)
class Clause:
    kind: str  # one of CLAUSE_KINDS
    text: str
    passed: bool
    soft: float


def _top_mean(values: list[float], k: int) -> float:
    return sum(sorted(values, reverse=True)[:k]) / k


@dataclass(frozen=True)
class _Obj:
    """One detection as plain Python values (clause logic runs on a handful of objects per image)."""

    shape: int
    color: int
    center: tuple[float, float]
    size: tuple[float, float]
    probs: tuple[float, ...]


def _objects_per_image(det: Detections) -> list[list[_Obj]]:
    rows = zip(det.image.tolist(), det.shape.tolist(), det.color.tolist(), det.center.tolist(),
               det.size.tolist(), det.shape_probs.tolist())
    out: list[list[_Obj]] = [[] for _ in range(det.batch_size)]
    for b, shape, color, center, size, probs in rows:
        out[b].append(_Obj(shape, color, tuple(center), tuple(size), tuple(probs)))
    return out


def _relation(relation: str, a: _Obj, b: _Obj) -> bool:
    return relation_holds(relation, a.center, a.size, b.center, b.size)


def check_image(spec: PromptSpec, objs: list[_Obj]) -> list[Clause]:
    """Clause results of one image's detections against a prompt spec."""
    clauses = []
    candidates = []
    for o in spec.objects:
        s = SHAPES.index(o.shape)
        c = COLORS.index(o.color) if o.color is not None else None
        n_shape = sum(d.shape == s for d in objs)
        fit = [d.probs[s] for d in objs]
        if spec.exact_count:
            soft = _top_mean(fit, o.count) * min(1.0, o.count / max(n_shape, 1))
            clauses.append(Clause("count", f"exactly {o.count} {o.shape}", n_shape == o.count, soft))
        else:
            clauses.append(Clause("object", f">= {o.count} {o.shape}", n_shape >= o.count, _top_mean(fit, o.count)))
        candidates.append([d for d in objs if d.shape == s and (c is None or d.color == c)])
        if c is None:
            continue
        n_right = len(candidates[-1])
        soft = _top_mean([d.probs[s] * (d.color == c) for d in objs], o.count)
        clauses.append(Clause("color", f">= {o.count} {o.color} {o.shape}", n_right >= o.count, soft))
    if spec.relation is not None:
        a, b = spec.objects
        sa, sb = SHAPES.index(a.shape), SHAPES.index(b.shape)
        hits = [
            da.probs[sa] * db.probs[sb]
            for da in candidates[0]
            for db in candidates[1]
            if da is not db and _relation(spec.relation, da, db)
        ]
        clauses.append(Clause("position", f"{a.shape} {spec.relation} {b.shape}", bool(hits), max(hits, default=0.0)))
    return clauses


@dataclass
class CheckResult:
    """Batch results: (B,) tensors plus the per-image clause lists."""

    strict: torch.Tensor
    partial: torch.Tensor
    soft: torch.Tensor
    by_kind: dict[str, torch.Tensor]  # fraction of clauses of each kind that hold; NaN when absent
    clauses: list[list[Clause]]


def check(specs: list[PromptSpec], detections: Detections) -> CheckResult:
    """Check each image's detections against its prompt spec."""
    if len(specs) != detections.batch_size:
        raise RewardInputError(
            f"specs and images must have the same length: got {len(specs)} specs for {detections.batch_size} images"
        )
    per_image = _objects_per_image(detections)
    all_clauses = [check_image(spec, objs) for spec, objs in zip(specs, per_image)]
    strict = torch.tensor([float(all(c.passed for c in cl)) for cl in all_clauses])
    partial = torch.tensor([sum(c.passed for c in cl) / len(cl) for cl in all_clauses])
    soft = torch.tensor([sum(c.soft for c in cl) / len(cl) for cl in all_clauses])
    by_kind = {}
    for kind in CLAUSE_KINDS:
        vals = []
        for cl in all_clauses:
            mine = [c.passed for c in cl if c.kind == kind]
            vals.append(sum(mine) / len(mine) if mine else float("nan"))
        by_kind[kind] = torch.tensor(vals)
    return CheckResult(strict, partial, soft, by_kind, all_clauses)


def evaluate_images(prompts_or_specs: list[str] | list[PromptSpec], images: torch.Tensor) -> CheckResult:
    """Detect and check in one call: prompts (parsed) or specs, with a (B, 3, H, W) batch in [0, 1]."""
    from mmreward.synthetic.captions import parse_prompt

    specs = [p if isinstance(p, PromptSpec) else parse_prompt(p) for p in prompts_or_specs]
    return check(specs, detect(images))
