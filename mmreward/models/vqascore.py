"""VQAScore (Lin et al., ECCV 2024): the VLM's probability of answering "Yes" to

    'Does this figure show "{text}"? Please answer Yes or No.'

as t2v_metrics scores Qwen2(.5)-VL (linzhiqiu/t2v_metrics @ 6ecb74f,
t2v_metrics/models/vqascore_models/qwen2vl_model.py, `Qwen2VLModel.forward` defaults: that template, answer
'Yes', `generate(max_new_tokens=1, do_sample=False, temperature=1.0, output_scores=True)`, P = softmax of the
first step's scores at the 'Yes' token). Those scores are the logits after the checkpoint's logits processors:
Qwen2.5-VL-Instruct's generation_config has repetition_penalty 1.05, which divides the positive logits (and
multiplies the negative ones) of every token already in the prompt, 'Yes' included ('Please answer Yes or
No.'). We apply the same penalty (`repetition_penalty=None`: the checkpoint's; 1.0: none).

Teacher-forced in one batched forward: the answer tokens are appended after the generation prompt and
P(answer) = prod_t p(answer_t | prompt, answer_<t) is read from the logits (no generate loop). For a
one-token "Yes" this is exactly t2v_metrics' number. For a multi-token answer t2v_metrics (one generated
token) scores only the first answer token; we score them all.

Pixels follow t2v_metrics' inputs to qwen_vl_utils: images at its defaults (4..16384 patches of 28x28, the
native resolution of most generated images), video frames at most 360*420 pixels (at least 128 patches), and
video files sampled at 8 fps by qwen_vl_utils' rule (clip tensors need their rate: `score(..., fps=)`).
Not reproduced: qwen_vl_utils resizes 8-bit PIL images; we resize float tensors (identical when no resize
is needed). Transparent images lose their alpha (the default "drop_first"): t2v_metrics' `load_images` opens image
files as `Image.open(path).convert('RGB')` before qwen_vl_utils (whose own `to_rgb` would paste RGBA on white)
sees them (tests/mmreward/test_judge_fidelity.py checks an RGBA image). The loader is generic over AutoModelForImageTextToText with a chat template (Qwen2-VL /
Qwen2.5-VL tested).
"""

from __future__ import annotations

import torch

from mmreward.errors import RewardInputError
from mmreward.types import Reward, RewardOutput

QUESTION_TEMPLATE = 'Does this figure show "{}"? Please answer Yes or No.'  # t2v_metrics @ 6ecb74f, Qwen2VLModel
ANSWER_TEMPLATE = "Yes"
VIDEO_MAX_PIXELS = 360 * 420  # t2v_metrics' Qwen2VLModel.load_images for video files
VIDEO_FPS = 8.0  # t2v_metrics' QWEN2_VL_MODELS[...]['fps']


class VQAScore(Reward):
    name = "vqascore"
    modalities = ("image", "video")
    requires_prompt = True

    def __init__(
        self,
        model,
        processor,
        *,
        question_template: str = QUESTION_TEMPLATE,
        answer_template: str = ANSWER_TEMPLATE,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        repetition_penalty: float | None = None,
        video_fps: float | None = VIDEO_FPS,
        micro_batch_size: int = 8,
    ) -> None:
        """`min_pixels`/`max_pixels` None: t2v_metrics' (see the module docstring); `repetition_penalty` None: the
        checkpoint's generation_config (as t2v_metrics' generate applies it); `video_fps` None: every frame."""
        super().__init__(micro_batch_size=micro_batch_size)
        if repetition_penalty is not None and repetition_penalty <= 0:
            raise RewardInputError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        if "{}" not in question_template:
            raise RewardInputError(
                f"question_template must contain '{{}}' where the prompt goes, got {question_template!r}"
            )
        self.model = model
        self.processor = processor
        self.question_template = question_template
        self.answer_template = answer_template
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        if repetition_penalty is None:
            repetition_penalty = getattr(getattr(model, "generation_config", None), "repetition_penalty", None)
        self.repetition_penalty = float(repetition_penalty or 1.0)
        if video_fps:  # Reward.prepare keeps these frames of each clip (qwen_vl_utils' smart_nframes)
            self.card_fps, self.card_fps_sampling = float(video_fps), "qwen-vl-utils"
        answer_ids = processor.tokenizer(answer_template, add_special_tokens=False).input_ids
        if not answer_ids:
            raise RewardInputError(f"answer_template {answer_template!r} encodes to no tokens")
        self.register_buffer("answer_ids", torch.tensor(answer_ids), persistent=False)

    def _pixels(self, kind: str, num_frames: int) -> tuple[int, int]:
        from mmreward.judges.backends import qwen_default_pixels

        lo, hi = qwen_default_pixels(kind, num_frames)
        if kind == "video":
            hi = min(hi, VIDEO_MAX_PIXELS)  # qwen_vl_utils caps the frames at the max_pixels t2v_metrics gives
        return (self.min_pixels if self.min_pixels is not None else lo,
                self.max_pixels if self.max_pixels is not None else hi)

    def _penalize(self, logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                  pred_pos: torch.Tensor) -> torch.Tensor:
        """transformers' RepetitionPenaltyLogitsProcessor at each answer step: the logits of tokens already in
        the sequence (the real prompt tokens and the answer tokens before the step) are divided by the penalty
        when positive and multiplied by it when negative. logits: (B, k, V) at the answer steps."""
        b, k, v = logits.shape
        seen = torch.zeros(b, k, v, dtype=torch.bool, device=logits.device)
        for j in range(k):
            # everything up to and including the position that predicts answer token j
            upto = torch.arange(input_ids.shape[1], device=logits.device)[None, :] <= pred_pos[:, j:j + 1]
            ids = torch.where(upto & mask.bool(), input_ids, input_ids.new_full((), -1))
            for i in range(b):
                row = ids[i][ids[i] >= 0]
                seen[i, j, row] = True
        p = self.repetition_penalty
        penalized = torch.where(logits < 0, logits * p, logits / p)
        return torch.where(seen, penalized, logits)

    def _score(self, prompts, media):
        from mmreward.backbones.qwen_vl import build_batch, model_inputs

        first = media[0]
        kind = "video" if first.ndim == 4 else "image"
        min_pixels, max_pixels = self._pixels(kind, max(m.shape[0] for m in media) if kind == "video" else 1)
        questions = [self.question_template.format(p) for p in prompts]
        batch = build_batch(
            self.processor, questions, media, kind=kind, min_pixels=min_pixels,
            max_pixels=max_pixels, suffixes=[self.answer_template] * len(prompts),
        )
        inputs = model_inputs(batch, self.device, self.dtype)
        logits = self.model(**inputs).logits.float()  # (B, L, V)
        k = self.answer_ids.numel()
        # Right padding: the answer occupies the last k real positions of each row, and the logits
        # that predict answer token j sit one position earlier.
        lengths = inputs["attention_mask"].sum(dim=1)
        offsets = torch.arange(k, device=logits.device)
        pred_pos = (lengths[:, None] - k - 1) + offsets[None, :]  # (B, k)
        picked = logits.gather(1, pred_pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # (B, k, V)
        if self.repetition_penalty != 1.0:
            picked = self._penalize(picked, inputs["input_ids"], inputs["attention_mask"], pred_pos)
        picked = torch.log_softmax(picked, dim=-1)
        token_logp = picked.gather(2, self.answer_ids.to(logits.device)[None, :, None].expand(len(prompts), -1, 1))
        log_p = token_logp.squeeze(-1).sum(dim=1)
        return RewardOutput(log_p.exp(), {"log_p_yes": log_p})


def load_vqascore(checkpoint=None, *, weights="pretrained", tiny: bool = False, **options) -> VQAScore:
    from mmreward.backbones import qwen_vl

    if tiny:
        from mmreward.backbones.tiny_qwen_vl import tiny_qwen_vl_folder

        checkpoint = tiny_qwen_vl_folder()  # tiny=True always means the seeded tiny model, never the default hub id
        options.setdefault("max_pixels", 56 * 56)
        options.setdefault("min_pixels", 28 * 28)  # video frames too stay tiny
    if checkpoint is None:
        from mmreward.errors import CheckpointError

        raise CheckpointError("vqascore needs a checkpoint (a VLM folder or hub id), or tiny=True for tests")
    processor = qwen_vl.load_processor(checkpoint)
    if weights == "random":
        model = qwen_vl.vlm_from_config(qwen_vl.load_config(checkpoint))
    else:
        model = qwen_vl.load_vlm(checkpoint)
    return VQAScore(model, processor, **options)
