"""Image rewards on videos, and a temporal-consistency reward.

`FrameAggregate` wraps any image reward: it samples `num_frames` frames uniformly (indices
round(linspace(0, T-1, n))), scores all sampled frames of the batch in one call to the image reward
(prompt repeated per frame), and aggregates per video with mean, min, or the mean of the top k.
The wrapper is differentiable when the image reward is.

`temporal-consistency` is the mean cosine similarity of consecutive frames' embeddings (CLIP image
features by default, as VBench's subject/background consistency; raw pixels with backbone='pixels').

`motion` is how much a clip moves, without optical flow: the mean absolute difference between consecutive
frames, over pixels and channels, in [0, 1] (0 for a still clip). It is a crude dynamic-degree signal that
counters a temporal-consistency reward's pull toward frozen clips; being pixel-based it also rises with
flicker and noise, so pair it with a quality reward. The difference depends on the frame spacing: with
`num_frames` set, the clip is first subsampled uniformly (the same rule as video-frames), so a reward card
and not the generator's frame rate decides the spacing.

Frame sampling follows each reward's own card: a trainer hands full clips, and `num_frames` (video-frames,
temporal-consistency, motion; VideoAlign from its checkpoint's data_config) picks round(linspace(0, T-1, n)).
"""

from __future__ import annotations

from typing import Any

import torch

from mmreward.errors import RewardInputError
from mmreward.media import uniform_clip_indices
from mmreward.types import Reward, RewardOutput

AGGREGATIONS = ("mean", "min", "topk")


def sample_frame_indices(num_total: int, num_frames: int) -> torch.Tensor:
    """Uniform indices round(linspace(0, T-1, n)); all frames when n >= T (the rule files are decoded with)."""
    return uniform_clip_indices(num_total, num_frames)


def aggregate(per_frame: torch.Tensor, how: str, k: int = 1, higher_is_better: bool = True) -> torch.Tensor:
    """(B, F) -> (B,). 'min' and 'topk' mean the worst / the k best frames in the reward's own sense."""
    if how == "mean":
        return per_frame.mean(dim=1)
    if how == "min":
        return per_frame.min(dim=1).values if higher_is_better else per_frame.max(dim=1).values
    if how == "topk":
        k = min(k, per_frame.shape[1])
        return per_frame.topk(k, dim=1, largest=higher_is_better).values.mean(dim=1)
    raise RewardInputError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")


class FrameAggregate(Reward):
    name = "video-frames"
    modalities = ("video",)

    def __init__(self, image_reward: Reward, num_frames: int = 8, aggregation: str = "mean", k: int = 3,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if "image" not in image_reward.modalities:
            raise RewardInputError(f"image_reward: expected an image reward, got '{image_reward.name}' "
                                   f"with modalities {image_reward.modalities}")
        if aggregation not in AGGREGATIONS:
            raise RewardInputError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if num_frames < 1 or k < 1:
            raise RewardInputError(f"num_frames and k must be >= 1, got {num_frames} and {k}")
        self.image_reward = image_reward
        self.num_frames, self.aggregation, self.k = num_frames, aggregation, k
        self.differentiable = image_reward.differentiable
        self.requires_prompt = image_reward.requires_prompt
        self.higher_is_better = image_reward.higher_is_better
        self.name = f"{image_reward.name}@frames"

    def _score(self, prompts, media):
        videos = list(media) if isinstance(media, list) else media
        frames, counts = [], []
        for v in videos:
            idx = sample_frame_indices(v.shape[0], self.num_frames).to(v.device)
            frames.append(v[idx])
            counts.append(len(idx))
        if len(set(counts)) != 1:
            raise RewardInputError(f"media: videos must have at least num_frames={self.num_frames} frames each "
                                   f"to aggregate in one batch, got sampled counts {counts}")
        flat = torch.cat(frames) if len({f.shape for f in frames}) > 1 else torch.stack(frames).flatten(0, 1)
        flat_prompts = [p for p in prompts for _ in range(counts[0])]
        out = self.image_reward._score(flat_prompts, flat)
        per_frame = out.scores.view(len(prompts), counts[0])
        score = aggregate(per_frame, self.aggregation, self.k, self.higher_is_better)
        return RewardOutput(score, {"frame_mean": per_frame.mean(dim=1), "frame_min": per_frame.min(dim=1).values})


def subsample_clip(video: torch.Tensor, num_frames: int | None) -> torch.Tensor:
    """(B, T, ...) or (T, ...) -> the card's `num_frames` uniform frames (all when None or n >= T)."""
    if num_frames is None:
        return video
    axis = 1 if video.ndim == 5 else 0
    return video.index_select(axis, sample_frame_indices(video.shape[axis], num_frames).to(video.device))


def _check_num_frames(num_frames: int | None, minimum: int) -> None:
    if num_frames is not None and (isinstance(num_frames, bool) or not isinstance(num_frames, int)
                                   or num_frames < minimum):
        raise RewardInputError(f"num_frames must be an integer >= {minimum} (or None: every frame), got {num_frames!r}")


class TemporalConsistency(Reward):
    name = "temporal-consistency"
    modalities = ("video",)
    requires_prompt = False
    differentiable = True

    def __init__(self, encoder: torch.nn.Module | None = None, num_frames: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_num_frames(num_frames, 2)
        self.encoder = encoder  # maps (N, 3, H, W) in [0, 1] to (N, D); None = raw pixels
        self.num_frames = num_frames

    def _embed(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.flatten(1) if self.encoder is None else self.encoder(frames)

    def _score(self, prompts, media):
        if isinstance(media, list):
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        media = subsample_clip(media, self.num_frames)
        b, t = media.shape[:2]
        if t < 2:
            raise RewardInputError(f"media: temporal consistency needs at least 2 frames, got {t}")
        emb = self._embed(media.flatten(0, 1)).float().view(b, t, -1)
        emb = torch.nn.functional.normalize(emb, dim=-1)
        sims = (emb[:, 1:] * emb[:, :-1]).sum(dim=-1)  # (B, T-1)
        return RewardOutput(sims.mean(dim=1), {"min_adjacent": sims.min(dim=1).values})


class Motion(Reward):
    """Mean |frame[t+1] - frame[t]| over pixels, channels and the T-1 steps of each clip (see the module doc)."""

    name = "motion"
    modalities = ("video",)
    requires_prompt = False
    differentiable = True

    def __init__(self, num_frames: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_num_frames(num_frames, 2)
        self.num_frames = num_frames

    def _score(self, prompts, media):
        if isinstance(media, list):
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        media = subsample_clip(media, self.num_frames)
        t = media.shape[1]
        if t < 2:
            raise RewardInputError(f"media: motion needs at least 2 frames, got {t}")
        steps = (media[:, 1:].float() - media[:, :-1].float()).abs().flatten(2).mean(dim=2)  # (B, T-1)
        return RewardOutput(steps.mean(dim=1), {"max_step": steps.max(dim=1).values})


def load_motion(checkpoint=None, *, weights="pretrained", **options) -> Motion:
    return Motion(**options)


def load_frame_aggregate(checkpoint=None, *, weights="pretrained", image_reward: str | Reward = "mock",
                         image_options: dict[str, Any] | None = None, **options) -> FrameAggregate:
    import mmreward

    inner = image_reward if isinstance(image_reward, Reward) else mmreward.load(
        image_reward, checkpoint=checkpoint, weights=weights, **(image_options or {}))
    return FrameAggregate(inner, **options)


def load_temporal_consistency(checkpoint=None, *, weights="pretrained", backbone: str = "clipscore",
                              backbone_options: dict[str, Any] | None = None, **options) -> TemporalConsistency:
    if backbone == "pixels":
        return TemporalConsistency(None, **options)
    import mmreward

    clip = mmreward.load(backbone, checkpoint=checkpoint, weights=weights, **(backbone_options or {}))
    tower = getattr(clip, "backbone", None)
    if tower is None or not hasattr(tower, "image_features"):
        raise RewardInputError(f"backbone '{backbone}' is not CLIP-based (no backbone.image_features); "
                               "use 'clipscore' or backbone='pixels'")
    return TemporalConsistency(_ImageFeatures(tower), **options)


class _ImageFeatures(torch.nn.Module):
    """A CLIP backbone's image tower (with its own preprocessing card) as a frame encoder."""

    def __init__(self, tower: torch.nn.Module) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.tower.image_features(frames)
