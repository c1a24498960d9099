"""Face reward: MTCNN (Zhang et al. 2016, facenet-pytorch's port) face detection confidence and count.

mode="confidence" (default) scores the most confident face's probability (0 when none is found),
e.g. for prompts that ask for a person; mode="count" scores the number of faces at or above
`min_prob`. `faces(media)` exposes boxes, probabilities and crops for downstream scoring (e.g. a
realism detector run on the faces only).

Weights: facenet-pytorch ships pnet.pt, rnet.pt and onet.pt (install it with
`pip install --no-deps facenet-pytorch`: its metadata pins an old torch); a checkpoint folder with
those three state dicts works the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from mmreward import preprocess as T
from mmreward.errors import ConfigError, MissingExtraError
from mmreward.types import Reward, RewardOutput

NET_FILES = ("pnet.pt", "rnet.pt", "onet.pt")


@dataclass
class Face:
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels
    prob: float
    crop: torch.Tensor  # (3, crop_size, crop_size) in [0, 1]


def _import_mtcnn():
    try:
        from facenet_pytorch import MTCNN
    except ImportError as exc:
        raise MissingExtraError(
            "the face reward needs the package 'facenet-pytorch', which is not installed. Install it with: "
            "pip install --no-deps facenet-pytorch (its metadata pins an old torch; mmreward[faces] cannot list it)"
        ) from exc
    return MTCNN


class FaceReward(Reward):
    name = "face-mtcnn"
    requires_prompt = False
    # Precision: MTCNN stays fp32 whatever the reward's dtype. It is a cascade of three tiny CNNs whose
    # outputs are thresholded and NMS-ed (facenet-pytorch's NMS has no bf16 kernel): bf16 would flip
    # windows across thresholds and save nothing.
    keep_fp32 = ("mtcnn",)

    def __init__(
        self,
        mtcnn: torch.nn.Module,
        *,
        mode: Literal["confidence", "count"] = "confidence",
        min_prob: float = 0.9,
        crop_size: int = 160,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in ("confidence", "count"):
            raise ConfigError(f"mode must be 'confidence' or 'count', got {mode!r}")
        if not 0.0 <= min_prob <= 1.0:
            raise ConfigError(f"min_prob must be in [0, 1], got {min_prob}")
        self.mtcnn = mtcnn
        self.mode, self.min_prob, self.crop_size = mode, min_prob, crop_size

    def detect(self, media: torch.Tensor | list[torch.Tensor]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per image: boxes (K, 4) x1 y1 x2 y2 and probabilities (K,), most confident first."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, m in enumerate(media):
            groups.setdefault(tuple(m.shape), []).append(i)
        result: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros((0, 4)), np.zeros(0))] * len(media)
        for idx in groups.values():  # MTCNN batches only equal-size images
            batch = torch.stack([media[i] for i in idx]).float().mul(255).permute(0, 2, 3, 1)
            boxes, probs = self.mtcnn.detect(batch)
            for i, b, p in zip(idx, boxes, probs):
                if b is None:
                    continue
                p = np.asarray(p, dtype=np.float64)
                order = np.argsort(-p, kind="stable")
                result[i] = (np.asarray(b)[order], p[order])
        return result

    def faces(self, media) -> list[list[Face]]:
        """Faces of each image with crops resized to crop_size (bilinear), for downstream rewards."""
        batch = self.prepare(media)
        out = []
        for img, (boxes, probs) in zip(batch, self.detect(batch)):
            h, w = img.shape[-2:]
            found = []
            for (x1, y1, x2, y2), p in zip(boxes, probs):
                left, top = int(np.clip(np.floor(x1), 0, w - 1)), int(np.clip(np.floor(y1), 0, h - 1))
                right, bottom = int(np.clip(np.ceil(x2), left + 1, w)), int(np.clip(np.ceil(y2), top + 1, h))
                crop = T.resize(img[None, :, top:bottom, left:right], (self.crop_size, self.crop_size), "bilinear")[0]
                found.append(Face((float(x1), float(y1), float(x2), float(y2)), float(p), crop.clamp(0, 1)))
            out.append(found)
        return out

    def _score(self, prompts, media):
        found = self.detect(media)
        best = torch.tensor([float(p[0]) if len(p) else 0.0 for _, p in found])
        count = torch.tensor([float((p >= self.min_prob).sum()) for _, p in found])
        scores = best if self.mode == "confidence" else count
        return RewardOutput(scores, {"best_face_prob": best, "face_count": count})


def load_mtcnn(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    mode: Literal["confidence", "count"] = "confidence",
    min_prob: float = 0.9,
    crop_size: int = 160,
    thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
    min_face_size: int = 20,
    micro_batch_size: int = 32,
) -> FaceReward:
    """`checkpoint`: a folder with pnet.pt, rnet.pt and onet.pt (default: the weights facenet-pytorch ships)."""
    from mmreward.checkpoints import load_state_dict, load_strict, resolve_files

    mtcnn = _import_mtcnn()(thresholds=list(thresholds), min_face_size=min_face_size, select_largest=False, keep_all=True)
    nets = (mtcnn.pnet, mtcnn.rnet, mtcnn.onet)
    if weights == "random":
        gen = torch.Generator().manual_seed(0)
        for net in nets:
            for p in net.parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if p.ndim > 1 else 0.5))
    elif checkpoint is not None:
        files = resolve_files(checkpoint, list(NET_FILES))
        for net, name in zip(nets, NET_FILES):
            load_strict(net, load_state_dict(files[name]), str(files[name]))
    return FaceReward(mtcnn, mode=mode, min_prob=min_prob, crop_size=crop_size, micro_batch_size=micro_batch_size)
