"""Compositional (GenEval-style) reward: does the image contain the objects, counts, colours and positions the prompt asks for?

Prompts are parsed into clauses (GenEval's templates, `mmreward.geneval.prompt_parser`), or read from
GenEval metadata rows passed as `score(..., metadata=)` (`{"tag", "include": [...]}`), a pluggable
detector finds the named objects, and GenEval's rules decide each clause (`mmreward.geneval.evaluate`).
score="strict" gives 1 when every clause holds (GenEval's accuracy, Flow-GRPO's GenEval reward);
score="partial" averages per-clause credit for a denser signal. Both are always in `details`.

Detectors: "owlv2" (transformers Owlv2ForObjectDetection; checkpoint a hub id or folder, default
google/owlv2-base-patch16-ensemble), "grounding-dino" (transformers GroundingDinoForObjectDetection,
default IDEA-Research/grounding-dino-tiny; `detector_options` box_threshold/text_threshold),
"shapesworld" (the exact analytic detector of the toy world), or any object with
`detect(images, names)` passed as `detector=`.
"""

from __future__ import annotations

import tempfile
from typing import Literal

import torch

from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput

OWLV2_CHECKPOINT = "google/owlv2-base-patch16-ensemble"


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
        detector,
        *,
        score: Literal["strict", "partial"] = "strict",
        score_threshold: float = 0.3,
        counting_threshold: float = 0.9,
        max_objects: int = 16,
        position_margin: float = 0.1,
        color_of=None,
        **kwargs,
    ) -> None:
        from mmreward.geneval.evaluate import Thresholds

        super().__init__(**kwargs)
        if score not in ("strict", "partial"):
            raise ConfigError(f"score must be 'strict' or 'partial', got {score!r}")
        if not callable(getattr(detector, "detect", None)):
            raise ConfigError(f"detector must have a detect(images, names) method, got {type(detector).__name__}")
        self.detector = detector
        self.score_kind = score
        self.thresholds = Thresholds(score_threshold, counting_threshold, max_objects, position_margin)
        self.color_of = color_of
        # the detector's network (the detector itself, or the `.model` of OWLv2/Grounding DINO wrappers) is a
        # submodule, so that device moves and the `attention` choice (mmreward.attention) reach it
        module = detector if isinstance(detector, torch.nn.Module) else getattr(detector, "model", None)
        if isinstance(module, torch.nn.Module):
            self.detector_module = module

    def evaluate(self, prompts: list[str], media, metadata: list[dict] | None = None):
        from mmreward.geneval.colors import box_color
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
            color_of = self.color_of or (lambda d, image=image: box_color(image, d.box))
            results.append(evaluate(spec, dets, color_of=color_of, thresholds=self.thresholds))
        return results

    def _score(self, prompts, media, metadata: list[dict] | None = None):
        results = self.evaluate(prompts, media, metadata)
        strict = torch.tensor([float(r.strict) for r in results])
        partial = torch.tensor([r.partial for r in results], dtype=torch.float32)
        return RewardOutput(
            strict if self.score_kind == "strict" else partial,
            {"strict": strict, "partial": partial},
            rationales=[r.reason() for r in results],
        )


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
    detector="owlv2",
    score: Literal["strict", "partial"] = "strict",
    score_threshold: float | None = None,
    counting_threshold: float | None = None,
    max_objects: int = 16,
    position_margin: float = 0.1,
    detector_options: dict | None = None,
    micro_batch_size: int = 8,
) -> CompositionalReward:
    if detector == "owlv2":
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
            f"detector must be 'owlv2', 'grounding-dino', 'shapesworld' or an object with detect(images, names), "
            f"got {detector!r}"
        )
    else:
        det = detector
    # GenEval's thresholds (0.3, 0.9 for counting) are for learned detectors; the analytic one is exact
    exact = detector == "shapesworld"
    if score_threshold is None:
        score_threshold = 0.0 if exact else 0.3
    if counting_threshold is None:
        counting_threshold = 0.0 if exact else 0.9
    return CompositionalReward(
        det, score=score, score_threshold=score_threshold, counting_threshold=counting_threshold,
        max_objects=max_objects, position_margin=position_margin, micro_batch_size=micro_batch_size,
    )  # fmt: skip
