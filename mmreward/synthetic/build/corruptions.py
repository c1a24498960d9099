"""Make ShapesWorld images worse in known ways, to build preference pairs and quality targets.

Semantic corruptions change a scene so that it no longer matches its prompt (wrong colour, wrong
shape, a missing or extra object, swapped positions); quality corruptions damage the pixels (blur,
noise, washed-out contrast, holes in the shapes) by a known amount in [0, 1].
"""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn.functional as F

from mmreward.synthetic.prompts import COLORS, SHAPES
from mmreward.synthetic.scenes import BACKGROUND, Scene

SEMANTIC = ("color", "shape", "drop", "swap")


def corrupt_scene(scene: Scene, rng: random.Random) -> Scene:
    """A scene that violates `scene.spec` (same prompt, wrong content)."""
    objs = list(scene.objects)
    kinds = ["color", "shape"] + (["drop"] if len(objs) > 1 else []) + (["swap"] if scene.spec.relation else [])
    kind = rng.choice(kinds)
    i = rng.randrange(len(objs))
    if kind == "color":
        objs[i] = dataclasses.replace(objs[i], color=rng.choice([c for c in COLORS if c != objs[i].color]))
        if all(o.color is None for o in scene.spec.objects):  # colour does not matter: change the shape instead
            kind = "shape"
    if kind == "shape":
        objs[i] = dataclasses.replace(objs[i], shape=rng.choice([s for s in SHAPES if s != objs[i].shape]))
    elif kind == "drop":
        del objs[i]
    elif kind == "swap":
        a, b = objs[0], objs[1]
        objs[0], objs[1] = dataclasses.replace(a, x=b.x, y=b.y), dataclasses.replace(b, x=a.x, y=a.y)
    return dataclasses.replace(scene, objects=tuple(objs))


def degrade(images: torch.Tensor, level: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Damage each image by `level[i]` in [0, 1] with one of blur, noise, low contrast or holes."""
    b = images.shape[0]
    kind = torch.randint(0, 4, (b,), generator=generator)
    lv = level.view(b, 1, 1, 1)
    out = images.clone()
    # blur: a box blur whose mix grows with the level
    blurred = F.avg_pool2d(F.pad(images, (2, 2, 2, 2), mode="replicate"), 5, stride=1)
    out = torch.where((kind == 0).view(b, 1, 1, 1), (1 - lv) * images + lv * blurred, out)
    noisy = images + 0.5 * lv * torch.randn(images.shape, generator=generator)
    out = torch.where((kind == 1).view(b, 1, 1, 1), noisy, out)
    bg = torch.tensor(BACKGROUND).view(1, 3, 1, 1)
    washed = images + 0.7 * lv * (images.mean((1, 2, 3), keepdim=True) - images)
    out = torch.where((kind == 2).view(b, 1, 1, 1), washed, out)
    holes = torch.rand(images.shape[0], 1, *images.shape[2:], generator=generator) < 0.6 * lv
    out = torch.where((kind == 3).view(b, 1, 1, 1) & holes, bg.expand_as(images), out)
    return out.clamp(0, 1)
