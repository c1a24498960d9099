"""Tiny random-weight PP-OCR checkpoints in the official layout (det ONNX, rec ONNX, keys file), for tests.

The graphs have the official input/output signatures: det maps (N, 3, H, W) to a sigmoid map
(N, 1, H, W); rec maps (N, 3, 48, W) to per-step softmax probabilities (N, W / 8, C).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mmreward.errors import require
from mmreward.ocr.ppocr import MODEL_FILES

TINY_CHARSET = list("abcdefghijklmnop")


def _tensor(name: str, array: np.ndarray):
    onnx = require("onnx", "ocr", "Writing tiny ONNX checkpoints")
    return onnx.numpy_helper.from_array(array.astype(np.float32), name)


def write_random_ppocr(folder: str | os.PathLike, seed: int = 0, layout: str = "ppocrv5") -> Path:
    """Write random-weight det and rec ONNX files and the character file of `layout` into `folder`:
    'ppocrv5' (ppocrv5_det.onnx, ppocrv5_rec.onnx, ppocr_keys_v5.txt with the blank as line 0) or
    'ppocrv4_en' (en_PP-OCRv3_det.onnx, en_PP-OCRv4_rec.onnx, en_dict.txt without the blank, as PaddleOCR's)."""
    det_file, rec_file, dict_file, dict_format = MODEL_FILES[layout]
    onnx = require("onnx", "ocr", "Writing tiny ONNX checkpoints")
    helper, tp = onnx.helper, onnx.TensorProto
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    det = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["z"], pads=[2, 2, 2, 2], kernel_shape=[5, 5]),
            helper.make_node("Sigmoid", ["z"], ["prob"]),
        ],
        "tiny_det",
        [helper.make_tensor_value_info("x", tp.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("prob", tp.FLOAT, ["n", 1, "h", "w"])],
        [_tensor("w", rng.normal(0, 0.2, (1, 3, 5, 5))), _tensor("b", np.array([0.5]))],
    )
    n_classes = len(TINY_CHARSET) + 2  # blank + characters + space
    rec = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["z"], kernel_shape=[48, 8], strides=[48, 8]),
            helper.make_node("Squeeze", ["z", "axis"], ["s"]),
            helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Softmax", ["t"], ["probs"], axis=-1),
        ],
        "tiny_rec",
        [helper.make_tensor_value_info("x", tp.FLOAT, ["n", 3, 48, "w"])],
        [helper.make_tensor_value_info("probs", tp.FLOAT, ["n", "t", n_classes])],
        [
            _tensor("w", rng.normal(0, 0.05, (n_classes, 3, 48, 8))),
            _tensor("b", rng.normal(0, 0.5, (n_classes,))),
            onnx.numpy_helper.from_array(np.array([2], dtype=np.int64), "axis"),
        ],
    )
    for graph, name in ((det, det_file), (rec, rec_file)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        onnx.save(model, str(folder / name))
    # both layouts decode to the classes blank + characters + space
    lines = ["blank", *TINY_CHARSET, " "] if dict_format == "keys_with_blank" else TINY_CHARSET
    (folder / dict_file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
