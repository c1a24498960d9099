"""Random views for reward expectations (ReNO against small rewards) and the objective's use of them."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.inference.augment import RandomViews, gaussian_blur
from diffusion_rl.inference.objective import RewardObjective, RewardTerm
from mmreward.errors import ConfigError, RewardInputError


def test_gaussian_blur_matches_a_direct_2d_convolution_and_keeps_constants():
    torch.manual_seed(0)
    x = torch.rand(2, 3, 12, 12)
    sigma = 0.8
    radius = math.ceil(2 * sigma)
    # independent computation: the full 2-D kernel exp(-(i^2 + j^2) / 2 sigma^2), normalised, on replicate padding
    i = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k2 = torch.exp(-(i.view(-1, 1) ** 2 + i.view(1, -1) ** 2) / (2 * sigma**2))
    k2 = k2 / k2.sum()
    ref = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (radius,) * 4, mode="replicate"),
                                     k2.expand(3, 1, -1, -1), groups=3)
    assert torch.allclose(gaussian_blur(x, sigma), ref, atol=1e-6)
    const = torch.full((1, 3, 8, 8), 0.3)
    assert torch.allclose(gaussian_blur(const, 1.3), const, atol=1e-6)


def test_random_views_shapes_identity_first_and_gradients():
    x = torch.rand(3, 3, 16, 16, requires_grad=True)
    views = RandomViews(views=5, max_shift=2, max_blur=1.0, noise=0.05, seed=1)(x)
    assert views.shape == (15, 3, 16, 16)
    assert torch.equal(views[:3], x)  # view 0 is the image itself
    assert not torch.allclose(views[3:6], x)  # the others differ
    assert 0 <= float(views.detach().min()) and float(views.detach().max()) <= 1
    views.sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


def test_random_views_are_reproducible_per_seed_and_validated():
    x = torch.rand(2, 3, 8, 8)
    a, b = RandomViews(views=3, seed=4)(x), RandomViews(views=3, seed=4)(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, RandomViews(views=3, seed=5)(x))
    with pytest.raises(ConfigError, match="views must be >= 1"):
        RandomViews(views=0)
    with pytest.raises(ConfigError, match="must be >= 0"):
        RandomViews(max_blur=-1)
    with pytest.raises(RewardInputError, match="expected \\(B, C, H, W\\)"):
        RandomViews()(torch.rand(3, 8, 8))


class _MeanBrightness(torch.nn.Module):
    """A stand-in reward: mean pixel value (higher is better), differentiable."""

    higher_is_better = True
    differentiable = True

    def score(self, prompts, images):
        from mmreward.types import RewardOutput

        assert len(prompts) == images.shape[0]
        return RewardOutput(scores=images.mean((1, 2, 3)), details={})


def test_objective_with_views_is_the_mean_over_the_views():
    x = torch.rand(4, 3, 8, 8)
    aug = RandomViews(views=3, seed=2)
    obj = RewardObjective([RewardTerm("b", 2.0, _MeanBrightness())], augment=aug)
    total, raw = obj(["p"] * 4, x)
    expected = RandomViews(views=3, seed=2)(x).mean((1, 2, 3)).view(3, 4).mean(0)
    assert torch.allclose(raw["b"], expected, atol=1e-6)
    assert torch.allclose(total, 2.0 * expected, atol=1e-6)
