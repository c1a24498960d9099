"""Grounding DINO (Liu et al. 2023) open-set detection through transformers, as a GenEval detector.

The class names of an image are joined into one caption as the official demo and the transformers
processor do ("cat. teddy bear."), images go through the checkpoint's own processor (shortest edge
800, longest 1333, ImageNet mean/std, padding masked by pixel_mask), and the processor's official
post-processing keeps a query when its best token probability exceeds `box_threshold`, with boxes in
the original image's pixels.

Which name a kept query found: the official post-processing decodes the tokens whose probability
exceeds `text_threshold` into a phrase, which can straddle names ("cat. dog") or be empty. We read
the same thresholded token map per name instead (the name whose caption tokens hold the highest
probability above `text_threshold`), and drop queries with no name token above it, as the demo
shows them with an empty label. Grounding DINO is a set predictor: no NMS by default (GenEval uses
none either); pass `nms_iou` to merge duplicates per class.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from mmreward.errors import CheckpointError, ConfigError, RewardInputError
from mmreward.geneval import Detection

GROUNDING_DINO_CHECKPOINT = "IDEA-Research/grounding-dino-tiny"


def caption_and_spans(names: Sequence[str], query_template: str = "{}") -> tuple[str, list[tuple[int, int]]]:
    """The caption "a. b." (lower-cased, as the processor merges label lists) and each name's character span."""
    caption, spans = "", []
    for name in names:
        phrase = query_template.format(name).strip().lower()
        if "." in phrase:
            raise RewardInputError(f"names: Grounding DINO separates class names with '.', got {name!r}")
        start = len(caption)
        caption += phrase
        spans.append((start, len(caption)))
        caption += ". "
    return caption.rstrip() if caption else ".", spans


class GroundingDINODetector:
    def __init__(
        self,
        model: torch.nn.Module,
        processor,
        *,
        box_threshold: float = 0.35,
        text_threshold: float = 0.25,
        query_template: str = "{}",
        nms_iou: float | None = None,
    ) -> None:
        for arg, value in (("box_threshold", box_threshold), ("text_threshold", text_threshold)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{arg} must be in [0, 1], got {value}")
        if nms_iou is not None and not 0.0 < nms_iou <= 1.0:
            raise ConfigError(f"nms_iou must be in (0, 1] or None, got {nms_iou}")
        self.model, self.processor = model, processor
        self.box_threshold, self.text_threshold = box_threshold, text_threshold
        self.query_template, self.nms_iou = query_template, nms_iou

    def _name_token_masks(self, captions: list[str], spans: list[list[tuple[int, int]]], length: int) -> torch.Tensor:
        """(B, max_names, length) bool: which caption tokens belong to each name (from the fast tokenizer's offsets)."""
        enc = self.processor.tokenizer(
            captions, return_offsets_mapping=True, padding="max_length", truncation=True, max_length=length
        )
        offsets = torch.tensor(enc["offset_mapping"])  # (B, L, 2); special and padding tokens are (0, 0)
        width = max(1, max(len(s) for s in spans))
        bounds = torch.tensor([list(s) + [(0, 0)] * (width - len(s)) for s in spans])  # (B, N, 2)
        start, end = offsets[:, None, :, 0], offsets[:, None, :, 1]
        real = end > start
        return real & (start >= bounds[..., :1]) & (end <= bounds[..., 1:])

    def detect(self, images: torch.Tensor | list[torch.Tensor], names: Sequence[Sequence[str]]) -> list[list[Detection]]:
        from torchvision.ops import batched_nms

        uint8 = [(img.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu() for img in images]
        built = [caption_and_spans(ns, self.query_template) for ns in names]
        captions, spans = [c for c, _ in built], [s for _, s in built]
        inputs = self.processor(images=uint8, text=captions, padding="longest", return_tensors="pt")
        inputs = inputs.to(self.model.device)
        with torch.no_grad():
            outputs = self.model(**inputs)
        sizes = [tuple(img.shape[-2:]) for img in uint8]
        results = self.processor.post_process_grounded_object_detection(
            outputs, inputs["input_ids"], threshold=self.box_threshold, text_threshold=self.text_threshold,
            target_sizes=sizes,
        )  # fmt: skip
        probs = outputs.logits.float().sigmoid().cpu()  # (B, Q, max_text_len)
        keep = probs.max(-1).values > self.box_threshold  # the post-processing's own query selection
        tokens = self._name_token_masks(captions, spans, probs.shape[-1]).float()  # (B, N, T); padded names: none
        above = torch.where(probs > self.text_threshold, probs, torch.zeros(()))
        best, label = (above[:, :, None, :] * tokens[:, None]).amax(-1).max(-1)  # (B, Q): best name per query
        out: list[list[Detection]] = []
        for i, (ns, res) in enumerate(zip(names, results)):
            boxes, scores = res["boxes"].float().cpu(), res["scores"].float().cpu()
            if len(boxes) != int(keep[i].sum()):
                raise RuntimeError("Grounding DINO post-processing kept a different set of queries than expected")
            named = best[i][keep[i]] > 0  # no name token above text_threshold: the demo's empty label
            boxes, scores, cls = boxes[named], scores[named], label[i][keep[i]][named]
            if self.nms_iou is not None and len(boxes):
                order = batched_nms(boxes, scores, cls, self.nms_iou)
                boxes, scores, cls = boxes[order], scores[order], cls[order]
            out.append([
                Detection(ns[int(c)], float(s), tuple(float(v) for v in b)) for b, s, c in zip(boxes, scores, cls)
            ])  # fmt: skip
        return out


def load_grounding_dino(checkpoint: str | os.PathLike | None, *, weights: str = "pretrained", **options) -> GroundingDINODetector:
    """A detector from a hub id or a folder saved with save_pretrained (model + processor with a BERT tokenizer)."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    if weights == "random":
        checkpoint = str(save_tiny_grounding_dino(tempfile.mkdtemp(prefix="mmreward_tiny_gdino_")))
    source = os.fspath(checkpoint) if checkpoint is not None else GROUNDING_DINO_CHECKPOINT
    if source.startswith("hf-hub:"):
        source = source[len("hf-hub:") :]
    try:
        from mmreward.checkpoints import load_pretrained

        model = load_pretrained(AutoModelForZeroShotObjectDetection, source).eval()
        processor = AutoProcessor.from_pretrained(source)
    except OSError as exc:
        raise CheckpointError(
            f"cannot load the Grounding DINO checkpoint '{source}': {exc}. Offline, pass a local folder saved with "
            "save_pretrained (model and processor), or cache the hub repo first."
        ) from exc
    if type(model).__name__ != "GroundingDinoForObjectDetection":
        raise CheckpointError(f"'{source}' holds a {type(model).__name__}, not a GroundingDinoForObjectDetection")
    return GroundingDINODetector(model, processor, **options)


def tiny_grounding_dino_config(vocab_size: int, image_size: int = 64):
    """A few-layer Grounding DINO (Swin backbone, BERT text encoder) for tests and weights='random'."""
    from transformers import BertConfig, GroundingDinoConfig, SwinConfig

    backbone = SwinConfig(
        image_size=image_size, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 1], window_size=2,
        out_features=["stage1", "stage2"],
    )  # fmt: skip
    text = BertConfig(
        vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64,
    )  # fmt: skip
    # decoder_layers >= 2: the box heads of layers 1.. are tied to layer 0's
    return GroundingDinoConfig(
        backbone_config=backbone.to_dict(), text_config=text.to_dict(), use_timm_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2,
        decoder_attention_heads=2, num_queries=12, num_feature_levels=2, encoder_n_points=2, decoder_n_points=2,
        max_text_len=32,
    )  # fmt: skip


def save_tiny_grounding_dino(folder: str | os.PathLike, *, image_size: int = 64, seed: int = 0) -> Path:
    """Write a random tiny Grounding DINO checkpoint (model, image processor, BERT tokenizer) in the official layout."""
    from transformers import (
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
    )

    from mmreward.tokenizers import build_bert_tokenizer

    out = Path(folder)
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = build_bert_tokenizer(tok_dir)
    torch.manual_seed(seed)
    model = GroundingDinoForObjectDetection(tiny_grounding_dino_config(len(tokenizer), image_size)).eval()
    size = {"shortest_edge": image_size, "longest_edge": image_size * 3 // 2}
    processor = GroundingDinoProcessor(image_processor=GroundingDinoImageProcessor(size=size), tokenizer=tokenizer)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
