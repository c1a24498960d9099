"""Differentiable random views of a batch, so a reward is scored as an expectation over small image changes.

Optimising pixels (or a pixel-space generator's noise) against one small reward model finds adversarial
textures: on the ShapesWorld generator ReNO drives the tiny CLIP's cosine from ~0.5 to ~0.9 while
ShapesEval accuracy falls. Averaging the reward over random shifts, blurs and pixel noise ("expectation
over transformation", Athalye et al., 2018) removes the gradient directions that only work for one exact
pixel grid, and leaves the ones that change what is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError, RewardInputError


@dataclass
class RandomViews:
    """`views` random views per image: integer shift up to `max_shift` px (replicate padding), Gaussian blur with
    sigma uniform in [0, max_blur], additive Gaussian noise of std `noise`. The first view is the identity when
    `include_identity` (so the un-augmented image always counts)."""

    views: int = 4
    max_shift: int = 2
    max_blur: float = 1.0
    noise: float = 0.03
    include_identity: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.views < 1:
            raise ConfigError(f"views must be >= 1, got {self.views}")
        if self.max_shift < 0 or self.max_blur < 0 or self.noise < 0:
            raise ConfigError(f"max_shift, max_blur and noise must be >= 0, got {self.max_shift}, {self.max_blur}, {self.noise}")
        self._generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (views * B, 3, H, W), view-major (rows v*B .. v*B + B - 1 are view v)."""
        if images.ndim != 4:
            raise RewardInputError(f"images: expected (B, C, H, W), got {tuple(images.shape)}")
        g = self._generator
        out = []
        h, w = images.shape[-2:]
        s = self.max_shift
        padded = F.pad(images, (s, s, s, s), mode="replicate") if s else images
        for v in range(self.views):
            if v == 0 and self.include_identity:
                out.append(images)
                continue
            dy, dx = (torch.randint(0, 2 * s + 1, (2,), generator=g).tolist() if s else (0, 0))
            view = padded[..., dy : dy + h, dx : dx + w]
            sigma = float(torch.rand((), generator=g)) * self.max_blur
            if sigma > 0.05:
                view = gaussian_blur(view, sigma)
            if self.noise > 0:
                view = view + self.noise * torch.randn(view.shape, generator=g).to(view)
            out.append(view.clamp(0, 1))
        return torch.cat(out)


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur (radius ceil(2 sigma), replicate padding); differentiable in `images`."""
    radius = max(1, int(torch.tensor(2 * sigma).ceil()))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    k = k / k.sum()
    c = images.shape[1]
    out = F.pad(images, (radius, radius, 0, 0), mode="replicate")
    out = F.conv2d(out, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    out = F.pad(out, (0, 0, radius, radius), mode="replicate")
    return F.conv2d(out, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
