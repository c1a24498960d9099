"""Compositional (GenEval) reward: does the image contain the objects, counts, colours and positions the prompt asks for?

Prompts are parsed into clauses (GenEval's templates, `mmreward.geneval.prompt_parser`), or read from
GenEval metadata rows passed as `score(..., metadata=)` (`{"tag", "include": [...]}`), a pluggable
detector finds the named objects, a colour classifier names their colours, and the originals' rules
decide (`mmreward.geneval.evaluate`). Three quantities, all always in `details`:
- score="accuracy": GenEval's `correct` (djghosh13/geneval evaluate_images.py; counts ">=", the
  benchmark's number);
- score="strict": Flow-GRPO's `strict_correct` (yifan123/reward-server gen_eval.py; counts "==");
- score="dense": Flow-GRPO's `score`, the mean of per-clause terms `1 - |count - found| / count` plus
  colour and position terms: the reward Flow-GRPO trains on (flow_grpo rewards.py uses `scores`).

Colours: colors="clip" (GenEval's: CLIP zero-shot on the masked crop over #999, default OpenAI
ViT-L/14 in open_clip's layout, `color_checkpoint`), "hsv" (a pixel heuristic), or an object with
`classify(image, objects, name)`. Detections that carry a colour (ShapesWorld) need neither.

Detectors: "mask2former" is GenEval's and Flow-GRPO's (mmdet Mask2Former Swin-S from the user-supplied
mmdet checkpoint file, run through transformers with mmdet's test pipeline and instance post-processing,
`mmreward.geneval.mask2former`; chosen by default when `checkpoint` is that .pth file); "owlv2"
(transformers Owlv2ForObjectDetection; checkpoint a hub id or folder, default
google/owlv2-base-patch16-ensemble), "grounding-dino" (transformers GroundingDinoForObjectDetection,
default IDEA-Research/grounding-dino-tiny; `detector_options` box_threshold/text_threshold),
"shapesworld" (the exact analytic detector of the toy world), or any object with
`detect(images, names)` passed as `detector=`. GenEval's thresholds (0.3, 0.9 for counting) were
tuned on Mask2Former's scores; with other detectors they are a choice, not the original.
"""
from __future__ import annotations

import tempfile
from typing import Any, Literal

import torch

from mmreward.errors import ConfigError
from mmreward.geneval import Detector
from mmreward.types import Reward, RewardOutput

OWLV2_CHECKPOINT = "google/owlv2-base-patch16-ensemble"
SCORES = ("accuracy", "strict", "dense")


class CompositionalReward(Reward):
    name = "geneval"
    requires_prompt = True
    accepts_metadata = True  # a GenEval metadata row states the clauses; the prompt is then not parsed
    # Precision: a detector's trunk may run in bf16; OWLv2's class head (with its learned logit
    # shift/scale) and box head stay fp32, since their sigmoid outputs are thresholded into the score.
    keep_fp32 = (
        "detector_module.model.class_head", "detector_module.model.box_head", "detector_module.model.box_bias",
        "detector_module.model.objectness_head",
    )

    def __init__(
        self,
        detector: Detector,
        *,
        score: Literal["accuracy", "strict", "dense"] = "accuracy",
        score_threshold: float = 0.3,
        counting_threshold: float = 0.9,
        max_objects: int = 16,
        position_margin: float = 0.1,
        max_overlap: float = 1.0,
        colors: Any = None,
        **kwargs,
    ) -> None:
        from mmreward.geneval.evaluate import Thresholds

        super().__init__(**kwargs)
        _check_score(score)
        if not callable(getattr(detector, "detect", None)):
            raise ConfigError(f"detector must have a detect(images, names) method, got {type(detector).__name__}")
        self.detector = detector
        self.score_kind = score
        self.thresholds = Thresholds(score_threshold, counting_threshold, max_objects, position_margin, max_overlap)
        if colors is not None and not callable(getattr(colors, "classify", None)):
            raise ConfigError(f"colors must have a classify(image, objects, name) method, got {type(colors).__name__}")
        self.colors = colors
        if isinstance(colors, torch.nn.Module):  # device moves and dtype reach the CLIP
            self.color_module = colors
        # the detector's network (the detector itself, or the `.model` of OWLv2/Grounding DINO wrappers) is a
        # submodule, so that device moves and the `attention` choice (mmreward.attention) reach it
        module = detector if isinstance(detector, torch.nn.Module) else getattr(detector, "model", None)
        if isinstance(module, torch.nn.Module):
            self.detector_module = module

    def evaluate(self, prompts: list[str], media, metadata: list[dict] | None = None):
        from mmreward.geneval.evaluate import evaluate
        from mmreward.geneval.prompt_parser import parse_prompt, spec_from_metadata

        # specs first: a bad prompt or metadata row fails before detection
        if metadata is None:
            specs = [parse_prompt(p) for p in prompts]
        else:
            specs = [spec_from_metadata(m) if m.get("include") is not None else parse_prompt(p)
                     for p, m in zip(prompts, metadata)]
        names = [list(dict.fromkeys(o.name for o in s.objects)) for s in specs]
        detections = self.detector.detect(media, names)
        results = []
        for spec, dets, image in zip(specs, detections, media):
            colors = None if self.colors is None else (lambda objs, name, image=image: self.colors.classify(image, objs, name))
            results.append(evaluate(spec, dets, colors=colors, thresholds=self.thresholds))
        return results

    def _score(self, prompts, media, metadata: list[dict] | None = None):
        results = self.evaluate(prompts, media, metadata)
        details = {
            "accuracy": torch.tensor([float(r.accuracy) for r in results]),
            "strict": torch.tensor([float(r.strict) for r in results]),
            "dense": torch.tensor([r.score for r in results], dtype=torch.float32),
        }
        return RewardOutput(details[self.score_kind], details, rationales=[r.reason() for r in results])


def _check_score(score: str) -> None:
    if score == "partial":
        raise ConfigError(
            "score='partial' was replaced by the originals' quantities: 'dense' is Flow-GRPO's training reward "
            "(per-clause 1 - |count - found| / count with colour and position terms), 'accuracy' GenEval's, "
            "'strict' Flow-GRPO's strict_correct"
        )
    if score not in SCORES:
        raise ConfigError(f"score must be one of {SCORES}, got {score!r}")


def _owlv2(checkpoint: str | None, weights: str, detector_options: dict):
    from transformers import Owlv2ForObjectDetection, Owlv2Processor

    from mmreward.checkpoints import load_pretrained
    from mmreward.errors import CheckpointError
    from mmreward.geneval.owlv2 import OWLv2Detector, save_tiny_owlv2

    if weights == "random":
        from mmreward.tokenizers import build_clip_tokenizer

        folder, tokenizer_dir = tempfile.mkdtemp(prefix="mmreward_tiny_owlv2_"), tempfile.mkdtemp(prefix="mmreward_clip_")
        build_clip_tokenizer(tokenizer_dir)
        checkpoint = str(save_tiny_owlv2(folder, tokenizer_dir))
    source = checkpoint or OWLV2_CHECKPOINT
    if source.startswith("hf-hub:"):
        source = source[len("hf-hub:") :]
    try:
        model = load_pretrained(Owlv2ForObjectDetection, source).eval()
        processor = Owlv2Processor.from_pretrained(source)
    except OSError as exc:
        raise CheckpointError(
            f"cannot load the OWLv2 checkpoint '{source}': {exc}. Offline, pass a local folder saved with "
            "save_pretrained (model and processor), or cache the hub repo first."
        ) from exc
    return OWLv2Detector(model, processor, **detector_options)


def load_geneval(
    checkpoint: str | None = None,
    *,
    weights: str = "pretrained",
    detector=None,
    score: Literal["accuracy", "strict", "dense"] = "accuracy",
    score_threshold: float | None = None,
    counting_threshold: float | None = None,
    max_objects: int = 16,
    position_margin: float = 0.1,
    max_overlap: float = 1.0,
    detector_options: dict | None = None,
    colors: Any = "clip",
    color_checkpoint: str | None = None,
    color_options: dict | None = None,
    micro_batch_size: int = 8,
) -> CompositionalReward:
    """GenEval reward. `colors`: "clip" (GenEval's classifier; `color_checkpoint` an open_clip or transformers
    CLIP, default OpenAI ViT-L/14; `color_options` for `load_clip_colors`), "hsv", or a classifier object."""
    _check_score(score)
    if detector is None:  # mmdet's Mask2Former file given: GenEval's own detector; otherwise OWLv2
        detector = "mask2former" if _is_mmdet_file(checkpoint) else "owlv2"
    if detector == "mask2former":
        from mmreward.geneval.mask2former import load_mask2former

        if checkpoint == OWLV2_CHECKPOINT:  # the spec's default checkpoint is OWLv2's
            checkpoint = None
        det = load_mask2former(checkpoint, weights=weights, **(detector_options or {}))
    elif detector == "owlv2":
        det = _owlv2(checkpoint, weights, detector_options or {})
    elif detector == "grounding-dino":
        from mmreward.geneval.grounding_dino import load_grounding_dino

        if checkpoint == OWLV2_CHECKPOINT:  # the spec's default checkpoint is OWLv2's
            checkpoint = None
        det = load_grounding_dino(checkpoint, weights=weights, **(detector_options or {}))
    elif detector == "shapesworld":
        from mmreward.geneval.shapesworld import ShapesWorldDetector

        det = ShapesWorldDetector()
    elif isinstance(detector, str):
        raise ConfigError(
            f"detector must be 'mask2former', 'owlv2', 'grounding-dino', 'shapesworld' or an object with "
            f"detect(images, names), "
            f"got {detector!r}"
        )
    else:
        det = detector
    # GenEval's thresholds (0.3, 0.9 for counting) are for learned detectors; the analytic one is exact
    exact = detector == "shapesworld"
    color_clf = _colors(colors, color_checkpoint, weights, color_options or {}, needed=not exact)
    if score_threshold is None:
        score_threshold = 0.0 if exact else 0.3
    if counting_threshold is None:
        counting_threshold = 0.0 if exact else 0.9
    return CompositionalReward(
        det, score=score, score_threshold=score_threshold, counting_threshold=counting_threshold,
        max_objects=max_objects, position_margin=position_margin, max_overlap=max_overlap, colors=color_clf,
        micro_batch_size=micro_batch_size,
    )  # fmt: skip


def _is_mmdet_file(checkpoint: str | None) -> bool:
    return checkpoint is not None and str(checkpoint).endswith((".pth", ".safetensors")) and "mask2former" in str(checkpoint)


def _colors(colors: Any, checkpoint: str | None, weights: str, options: dict, needed: bool):
    if colors == "clip":
        if not needed and checkpoint is None:  # ShapesWorld detections carry exact colours
            return None
        from mmreward.geneval.clip_colors import LazyClipColors

        return LazyClipColors(checkpoint, weights, options)
    if colors == "hsv":
        from mmreward.geneval.colors import HSVColors

        return HSVColors()
    if isinstance(colors, str):
        raise ConfigError(f"colors must be 'clip', 'hsv' or an object with classify(image, objects, name), got {colors!r}")
    return colors
