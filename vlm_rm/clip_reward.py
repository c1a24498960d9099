"""VLM-RM (Rocamonde et al. 2024): a CLIP-family model as a zero-shot reward for RL.

    R(x) = 1 - 1/2 || (x - g) P ||^2,    P = alpha * d d^T / ||d||^2 + (1 - alpha) I,    d = g - b

x is the L2-normalised image embedding of the rendered frame, g the mean of the L2-normalised
goal-prompt embeddings and b the mean of the baseline-prompt embeddings. alpha = 0 with a single
goal prompt gives the cosine similarity (1 - 1/2 ||x - g||^2 = x.g for unit vectors); alpha = 1
keeps only the component of (x - g) along the goal-baseline direction. As in the paper the means
g and b are *not* re-normalised unless `renormalize=True`. alpha can be changed at run time.

The reward needs only an embedding model with `image_features(images in [0, 1]) -> (B, D)` and
`text_features(list[str]) -> (B, D)`: the backbone of any CLIP-family reward in the mmreward
registry (clipscore, pickscore, hps, ...), which covers transformers CLIPModel folders and
open_clip checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput


class EmbeddingModel(Protocol):
    def image_features(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor: ...

    def text_features(self, prompts: list[str]) -> torch.Tensor: ...


def projection_matrix(g: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    """P = alpha d d^T / ||d||^2 + (1 - alpha) I (for reference and tests; the reward never forms it)."""
    d = g - b
    eye = torch.eye(d.numel(), dtype=d.dtype, device=d.device)
    return alpha * torch.outer(d, d) / d.dot(d) + (1 - alpha) * eye


def vlm_rm_reward(x: torch.Tensor, g: torch.Tensor, direction: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """1 - 1/2 ||(x - g) P||^2 for a batch x (B, D), with `direction` = d / ||d|| (None when alpha = 0).

    (x - g) P = alpha ((x - g).u) u + (1 - alpha)(x - g) for the unit vector u, so no D x D matrix.
    """
    diff = x - g
    if alpha == 0 or direction is None:
        proj = diff
    else:
        along = (diff @ direction)[:, None] * direction[None, :]
        proj = alpha * along + (1 - alpha) * diff
    return 1.0 - 0.5 * proj.pow(2).sum(dim=-1)


class VLMRMReward(Reward):
    """Reward of rendered frames for a fixed task given by goal (and baseline) prompts."""

    name = "vlm-rm"
    modalities = ("image",)
    differentiable = True
    requires_prompt = False  # the task is fixed at construction; per-item prompts are ignored

    def __init__(
        self,
        embedder: EmbeddingModel,
        goal_prompts: str | Sequence[str],
        baseline_prompts: str | Sequence[str] = (),
        alpha: float = 0.0,
        renormalize: bool = False,
        micro_batch_size: int = 64,
    ) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        goals = [goal_prompts] if isinstance(goal_prompts, str) else list(goal_prompts)
        baselines = [baseline_prompts] if isinstance(baseline_prompts, str) else list(baseline_prompts)
        if not goals or not all(isinstance(p, str) and p for p in goals):
            raise ConfigError(f"goal_prompts: expected one or more non-empty strings, got {goal_prompts!r}")
        if not all(isinstance(p, str) and p for p in baselines):
            raise ConfigError(f"baseline_prompts: expected non-empty strings, got {baseline_prompts!r}")
        self.embedder = embedder
        self.goal_prompts, self.baseline_prompts = goals, baselines
        self.renormalize = bool(renormalize)
        with torch.no_grad():
            g = self._mean_embedding(goals)
            b = self._mean_embedding(baselines) if baselines else None
        self.register_buffer("goal", g)
        self.register_buffer("baseline", b if b is not None else torch.zeros_like(g))
        self.has_baseline = b is not None
        d = g - self.baseline
        self.register_buffer("direction", d / d.norm() if self.has_baseline and d.norm() > 0 else torch.zeros_like(g))
        self._alpha = 0.0
        self.alpha = alpha

    def _mean_embedding(self, prompts: list[str]) -> torch.Tensor:
        mean = F.normalize(self.embedder.text_features(prompts).float(), dim=-1).mean(dim=0)
        return F.normalize(mean, dim=0) if self.renormalize else mean

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        value = float(value)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1], got {value}")
        if value > 0 and not self.has_baseline:
            raise ConfigError(
                f"alpha={value} projects onto the goal-baseline direction, but no baseline_prompts were given; "
                "pass baseline_prompts (e.g. 'a shape on a dark background') or use alpha=0"
            )
        if value > 0 and float(self.direction.norm()) == 0:
            raise ConfigError("goal and baseline prompts embed to the same mean; choose a different baseline")
        self._alpha = value

    def _score(self, prompts: list[str], media) -> RewardOutput:
        x = F.normalize(self.embedder.image_features(media).float(), dim=-1)
        r = vlm_rm_reward(x, self.goal, self.direction if self.alpha > 0 else None, self.alpha)
        return RewardOutput(r, {"cosine_to_goal": x @ self.goal / self.goal.norm()})


def clip_embedder(clip: str | Reward, **load_options: Any) -> Any:
    """The embedding backbone of a CLIP-family reward: a registry name/path, or a loaded reward."""
    if isinstance(clip, str):
        import mmreward

        clip = mmreward.load(clip, **load_options)
    backbone = getattr(clip, "backbone", None)
    if backbone is None or not hasattr(backbone, "image_features") or not hasattr(backbone, "text_features"):
        raise ConfigError(
            f"clip: reward '{getattr(clip, 'name', clip)}' has no CLIP backbone (image_features/text_features); "
            "use a CLIP-family reward such as 'clipscore' (transformers CLIPModel or open_clip checkpoints)"
        )
    return backbone
