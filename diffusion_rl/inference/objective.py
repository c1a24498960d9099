"""A weighted set of registry rewards used as the objective of noise search and optimisation.

objective(images) = sum_k w_k * s_k * r_k(images), with s_k = -1 for lower-is-better rewards so that
higher is always better. ReNO's losses are constants minus these rewards (e.g. 1 - HPS, 100 - CLIP),
which changes neither the gradients nor which iterate is best. Each reward's raw score is kept for
per-iteration logging.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.inference.augment import RandomViews
from mmreward.errors import ConfigError, RewardInputError
from mmreward.types import Reward


@dataclass
class RewardTerm:
    """One weighted reward; `detail` optimises one of its `details` instead of its score (e.g. CLIPScore's
    unclamped "cosine": the score clamps at 0, which leaves no gradient where the cosine is negative)."""

    name: str
    weight: float
    reward: Reward
    detail: str | None = None

    @property
    def sign(self) -> float:
        return 1.0 if self.reward.higher_is_better else -1.0


def parse_weighted(items: Iterable[str]) -> dict[str, float]:
    """["hpsv2.1=5", "imagereward=1", "clipscore"] -> {"hpsv2.1": 5.0, "imagereward": 1.0, "clipscore": 1.0}."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = str(item).rpartition("=")
        if not sep:
            name, value = value, "1"
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(
                f"reward: expected NAME=WEIGHT such as 'hpsv2.1=5', got {item!r} (the weight is not a number)"
            ) from None
        if not name:
            raise ConfigError(f"reward: expected NAME=WEIGHT such as 'hpsv2.1=5', got {item!r} (no name)")
        if not math.isfinite(weight):
            raise ConfigError(f"reward: the weight of {name!r} must be a finite number, got {value!r}")
        out[name] = weight
    if not out:
        raise ConfigError("reward: give at least one reward, e.g. --reward hpsv2.1=5")
    return out


class RewardObjective:
    """Weighted rewards scored together: `objective(prompts, images) -> (total (B,), {name: raw (B,)})`."""

    def __init__(self, terms: Iterable[RewardTerm], augment: RandomViews | None = None) -> None:
        """augment: score every reward as the mean over random views of each image (see augment.py)."""
        self.terms = list(terms)
        self.augment = augment
        if not self.terms:
            raise ConfigError("rewards: expected at least one (name, weight, reward) term, got none")
        names = [t.name for t in self.terms]
        if len(set(names)) != len(names):
            raise ConfigError(f"rewards: names must be unique, got {names}")

    @classmethod
    def load(
        cls,
        weights: Mapping[str, float],
        *,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        reward_weights: str = "pretrained",
        details: Mapping[str, str] | None = None,
        augment: RandomViews | None = None,
    ) -> RewardObjective:
        """Load each reward with `mmreward.load(name, **options[name])`.

        reward_weights="random" builds tiny random rewards from each spec's `tiny_options` (tests, demos).
        """
        import mmreward
        from mmreward.registry import get_spec

        options, details = options or {}, details or {}
        for what, given in (("options", options), ("details", details)):
            unknown = set(given) - set(weights)
            if unknown:
                raise ConfigError(f"reward {what} given for {sorted(unknown)}, which are not among the rewards {sorted(weights)}")
        terms = []
        for name, weight in weights.items():
            opts = dict(options.get(name, {}))
            from mmreward.registry import refuse_load_arguments

            # device, dtype and weights are the run's; checkpoint stays a per-reward option
            refuse_load_arguments(opts, f"reward options of '{name}'", "the run sets device, dtype and weights "
                                  "for every reward", ("device", "dtype", "weights"))
            if reward_weights == "random":
                opts = {**get_spec(name.split(":")[0]).tiny_options, **opts}
            reward = mmreward.load(name, device=device, dtype=dtype, weights=reward_weights, **opts)
            terms.append(RewardTerm(name, float(weight), reward, details.get(name)))
        return cls(terms, augment=augment)

    @property
    def differentiable(self) -> bool:
        return all(t.reward.differentiable for t in self.terms)

    def require_differentiable(self, method: str) -> None:
        bad = [t.name for t in self.terms if not t.reward.differentiable]
        if bad:
            raise ConfigError(
                f"rewards: {method} backpropagates through the rewards, but {bad} are not differentiable. "
                "Use differentiable rewards (see `mmreward list`), or best-of-N, which takes any reward."
            )

    def check_modality(self, modality: str, maker: str) -> None:
        """ConfigError naming every reward that cannot score `modality` ("image" or "video"), which `maker`
        (e.g. "a wan pipeline") makes; raised before any sampling."""
        bad = [t for t in self.terms if modality not in t.reward.modalities]
        if bad:
            listed = ", ".join(f"{t.name}: {list(t.reward.modalities)}" for t in bad)
            hint = ("score videos with a video reward (e.g. temporal-consistency, videoalign, shapes-video-eval), or "
                    "wrap an image reward per frame with video-frames (mmreward.load('video-frames', "
                    "image_reward=NAME))" if modality == "video" else
                    "use image rewards, or a video pipeline (e.g. WanPipeline) for video rewards")
            raise ConfigError(f"reward(s) {[t.name for t in bad]} cannot score the {modality}s {maker} makes "
                              f"({listed}); {hint}")
        if modality == "video" and self.augment is not None:
            raise ConfigError("random views (--views) augment images only; use --views 1 with a video pipeline")

    def __call__(self, prompts: list[str], images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Score images (B, 3, H, W) or videos (B, T, 3, H, W), in [0, 1]."""
        if images.ndim not in (4, 5) or images.shape[-3] != 3 or images.shape[0] != len(prompts):
            raise RewardInputError(
                f"images: expected images (B, 3, H, W) or videos (B, T, 3, H, W) with B = {len(prompts)} prompts, "
                f"got {tuple(images.shape)}"
            )
        raw: dict[str, torch.Tensor] = {}
        b = images.shape[0]
        total = images.new_zeros(b, dtype=torch.float32)
        views = 1
        if self.augment is not None:
            if images.ndim == 5:
                raise ConfigError("random views (--views) augment images only; use --views 1 with a video pipeline")
            images = self.augment(images)
            views = images.shape[0] // b
            prompts = prompts * views
        for term in self.terms:
            out = term.reward.score(prompts, images)
            if term.detail is None:
                scores = out.scores
            elif term.detail in out.details:
                scores = out.details[term.detail].float()
            else:
                raise ConfigError(
                    f"reward '{term.name}' has no detail {term.detail!r}; its details are {sorted(out.details)}"
                )
            scores = scores.to(total.device).view(views, b).mean(0)
            raw[term.name] = scores
            total = total + term.weight * term.sign * scores
        return total, raw
