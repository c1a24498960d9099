"""A deterministic, differentiable reward for testing algorithms without any model.

score = -mean((pixel - c)^2) where c is the RGB colour named in the prompt (the first colour word
found), or a colour derived from a stable hash of the prompt when it names none.
"""

from __future__ import annotations

import hashlib

import torch

from mmreward.types import Reward, RewardOutput

COLOURS = {
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0),
    "purple": (0.5, 0.0, 0.5),
    "orange": (1.0, 0.5, 0.0),
    "white": (1.0, 1.0, 1.0),
    "black": (0.0, 0.0, 0.0),
}


def prompt_colour(prompt: str) -> tuple[float, float, float]:
    for word in prompt.lower().replace(",", " ").split():
        if word in COLOURS:
            return COLOURS[word]
    digest = hashlib.sha256(prompt.encode()).digest()
    return (digest[0] / 255.0, digest[1] / 255.0, digest[2] / 255.0)


class MockReward(Reward):
    name = "mock"
    modalities = ("image", "video")
    differentiable = True
    requires_prompt = False

    def _score(self, prompts, media):
        if isinstance(media, list):
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        target = torch.tensor([prompt_colour(p) for p in prompts], dtype=media.dtype, device=media.device)
        target = target.view(len(prompts), *([1] * (media.ndim - 4)), 3, 1, 1)
        err = (media - target).pow(2).flatten(1).mean(dim=1)
        return RewardOutput(-err, {"mse": err})


def load_mock(checkpoint=None, *, weights="pretrained", **options) -> MockReward:
    return MockReward(**options)
