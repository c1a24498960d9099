"""Random-weight ONNX graphs with the official input/output signatures of the packaged safety models.

What `weights="random"` loads for open-nsfw and nudenet: the runtime path (onnxruntime session, input
layout, output decoding) is the real one, only the graph in between is a small random stand-in.

open_nsfw: (N, 224, 224, 3) BGR minus VGG mean -> (N, 2) softmax [P(sfw), P(nsfw)].
NudeNet 320n (YOLOv8): (N, 3, 320, 320) in [0, 1] -> (N, 4 + 18, anchors) boxes (cx, cy, w, h) and class scores.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mmreward.errors import require


def _save(graph, path: Path) -> Path:
    onnx = require("onnx", "ocr", "Writing tiny ONNX checkpoints")
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_random_open_nsfw(path: str | os.PathLike, seed: int = 0) -> Path:
    onnx = require("onnx", "ocr", "Writing tiny ONNX checkpoints")
    helper, tp, nh = onnx.helper, onnx.TensorProto, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input", "axes"], ["pooled"], keepdims=0),
            helper.make_node("MatMul", ["pooled", "w"], ["logits0"]),
            helper.make_node("Add", ["logits0", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
        ],
        "tiny_open_nsfw",
        [helper.make_tensor_value_info("input", tp.FLOAT, ["n", 224, 224, 3])],
        [helper.make_tensor_value_info("prob", tp.FLOAT, ["n", 2])],
        [
            nh.from_array(np.array([1, 2], dtype=np.int64), "axes"),
            nh.from_array(rng.normal(0, 0.05, (3, 2)).astype(np.float32), "w"),
            nh.from_array(np.zeros(2, dtype=np.float32), "b"),
        ],
    )
    return _save(graph, Path(path))


def write_random_nudenet(path: str | os.PathLike, seed: int = 0, n_classes: int = 18) -> Path:
    onnx = require("onnx", "ocr", "Writing tiny ONNX checkpoints")
    helper, tp, nh = onnx.helper, onnx.TensorProto, onnx.numpy_helper
    rng = np.random.default_rng(seed)
    channels = 4 + n_classes
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["images", "w", "b"], ["z"], kernel_shape=[16, 16], strides=[16, 16]),
            helper.make_node("Reshape", ["z", "shape"], ["flat"]),
            helper.make_node("Sigmoid", ["flat"], ["unit"]),
            helper.make_node("Mul", ["unit", "scale"], ["output0"]),
        ],
        "tiny_nudenet",
        [helper.make_tensor_value_info("images", tp.FLOAT, ["n", 3, 320, 320])],
        [helper.make_tensor_value_info("output0", tp.FLOAT, ["n", channels, 400])],
        [
            nh.from_array(rng.normal(0, 0.1, (channels, 3, 16, 16)).astype(np.float32), "w"),
            nh.from_array(rng.normal(-1, 0.5, (channels,)).astype(np.float32), "b"),
            nh.from_array(np.array([0, channels, -1], dtype=np.int64), "shape"),
            # box channels in pixels of the 320 input, class channels as probabilities
            nh.from_array(np.array([320.0] * 4 + [1.0] * n_classes, dtype=np.float32).reshape(1, channels, 1), "scale"),
        ],
    )
    return _save(graph, Path(path))
