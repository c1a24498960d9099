"""The conformance suite every registered reward must pass (called from tests/mmreward/test_conformance.py).

Checks: output shape and dtype, batch-order equivariance, compare antisymmetry, typed errors on bad
input (including zero-size media, lone-surrogate prompts and bad devices), non-constant outputs, and,
for differentiable rewards, gradients that reach the pixels.
"""

from __future__ import annotations

import torch

from mmreward.errors import DeviceError, MediaError, RewardInputError
from mmreward.types import Reward

PROMPTS = ["a red circle", "two blue squares", "a green triangle above a yellow star", "a photo of a cat"]


def sample_media(reward: Reward, batch: int = 4, size: int = 64, frames: int = 4, seed: int = 0) -> torch.Tensor:
    """Structured random media (smooth colour fields plus noise) so that real networks give distinct scores."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(batch, 3, 4, 4, generator=g)
    img = torch.nn.functional.interpolate(base, size=(size, size), mode="bilinear", align_corners=False)
    img = (img + 0.1 * torch.rand(batch, 3, size, size, generator=g)).clamp(0, 1)
    if "image" in reward.modalities:
        return img
    shift = torch.linspace(0, 0.2, frames).view(1, frames, 1, 1, 1)
    return (img[:, None] + shift).clamp(0, 1)


def check_conformance(reward: Reward, size: int = 64, atol: float = 1e-4, media: torch.Tensor | None = None,
                      prompts: list[str] | None = None) -> None:
    """`media`/`prompts` (4 items) replace the random ones for rewards that score only a structured world
    (an exact checker gives the same 0 to every random clip)."""
    media = sample_media(reward, size=size) if media is None else media
    n = media.shape[0]
    prompts = PROMPTS[:n] if prompts is None else list(prompts)

    out = reward.score(prompts, media)
    assert out.scores.shape == (n,), f"scores must have shape ({n},), got {tuple(out.scores.shape)}"
    assert out.scores.dtype == torch.float32, f"scores must be float32, got {out.scores.dtype}"
    assert not out.scores.requires_grad, "scores of a non-grad input must not carry autograd history"
    for key, value in out.details.items():
        assert value.shape[0] == n, f"details[{key!r}] must have batch size {n}, got {tuple(value.shape)}"

    finite = torch.isfinite(out.scores)
    assert finite.all() or reward.may_return_nan, "scores must be finite"
    assert out.scores[finite].unique().numel() > 1, "outputs are constant across different inputs"

    perm = torch.tensor([2, 0, 3, 1])
    permuted = reward.score([prompts[i] for i in perm], media[perm])
    torch.testing.assert_close(permuted.scores, out.scores[perm], atol=atol, rtol=1e-4, equal_nan=True)

    ab = reward.compare(prompts[:2], media[:2], media[2:4])
    ba = reward.compare(prompts[:2], media[2:4], media[:2])
    assert ab.prob_a.shape == (2,)
    assert bool(((ab.prob_a >= 0) & (ab.prob_a <= 1)).all()), "prob_a must be a probability"
    torch.testing.assert_close(ab.prob_a + ba.prob_a, torch.ones(2), atol=1e-4, rtol=0)

    _expect(RewardInputError, "same length", reward.score, prompts[:2], media)
    _expect(RewardInputError, "empty", reward.score, [], media[:0])
    _expect(MediaError, "shape", reward.score, prompts[:1], torch.rand(3, 3))
    _expect(MediaError, "value_range", reward.score, prompts, media * 255)
    _expect(RewardInputError, "same length", reward.compare, prompts[:2], media[:2], media[:3])
    _expect(MediaError, "0 pixels", reward.score, prompts[:1], media[:1, ..., :0, :0])
    _expect(RewardInputError, "surrogate", reward.score, ["\ud800"] * n, media)
    _expect(RewardInputError, "surrogate", reward.compare, ["ok", "\udfff"], media[:2], media[2:4])
    _expect(DeviceError, "not a device", reward.to, "banana")

    if reward.differentiable:
        x = media.clone().requires_grad_(True)
        y = reward.score(prompts, x).scores
        assert y.requires_grad, "a differentiable reward must keep the graph from the pixels"
        y.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all(), "gradients must reach the pixels"
        assert x.grad.abs().sum() > 0, "gradients on the pixels are all zero"
        torch.testing.assert_close(y.detach(), out.scores, atol=max(atol, 1e-3), rtol=1e-3)
    else:
        _expect(RewardInputError, "not differentiable", reward.score, prompts, media.clone().requires_grad_(True))


def _expect(exc_type: type[Exception], fragment: str, fn, *args) -> None:
    try:
        fn(*args)
    except exc_type as exc:
        assert fragment in str(exc), f"{exc_type.__name__} message should mention {fragment!r}: {exc}"
        return
    raise AssertionError(f"{fn.__name__}{tuple(type(a).__name__ for a in args)} should raise {exc_type.__name__}")
