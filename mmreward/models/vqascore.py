"""VQAScore (Lin et al., ECCV 2024): the VLM's probability of answering "Yes" to

    'Does this figure show "{text}"? Please answer yes or no.'

Teacher-forced in one batched forward: the answer tokens are appended after the generation prompt and
P(answer) = prod_t p(answer_t | prompt, answer_<t) is read from the logits (no generate loop). For a
one-token "Yes" this is exactly the next-token probability t2v_metrics reads from `generate`. Videos
go through the model's own video input. The loader is generic over AutoModelForImageTextToText with a
chat template (Qwen2-VL / Qwen2.5-VL tested).
"""

from __future__ import annotations

import torch

from mmreward.errors import RewardInputError
from mmreward.types import Reward, RewardOutput

QUESTION_TEMPLATE = 'Does this figure show "{}"? Please answer yes or no.'
ANSWER_TEMPLATE = "Yes"


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
        min_pixels: int = 28 * 28 * 4,
        max_pixels: int = 448 * 448,
        micro_batch_size: int = 8,
    ) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        if "{}" not in question_template:
            raise RewardInputError(
                f"question_template must contain '{{}}' where the prompt goes, got {question_template!r}"
            )
        self.model = model
        self.processor = processor
        self.question_template = question_template
        self.answer_template = answer_template
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        answer_ids = processor.tokenizer(answer_template, add_special_tokens=False).input_ids
        if not answer_ids:
            raise RewardInputError(f"answer_template {answer_template!r} encodes to no tokens")
        self.register_buffer("answer_ids", torch.tensor(answer_ids), persistent=False)

    def _score(self, prompts, media):
        from mmreward.models._qwen_vl import build_batch, model_inputs

        first = media[0]
        kind = "video" if first.ndim == 4 else "image"
        questions = [self.question_template.format(p) for p in prompts]
        batch = build_batch(
            self.processor, questions, media, kind=kind, min_pixels=self.min_pixels,
            max_pixels=self.max_pixels, suffixes=[self.answer_template] * len(prompts),
        )
        inputs = model_inputs(batch, self.device, self.dtype)
        logits = self.model(**inputs).logits.float()  # (B, L, V)
        k = self.answer_ids.numel()
        # Right padding: the answer occupies the last k real positions of each row, and the logits
        # that predict answer token j sit one position earlier.
        lengths = inputs["attention_mask"].sum(dim=1)
        offsets = torch.arange(k, device=logits.device)
        pred_pos = (lengths[:, None] - k - 1) + offsets[None, :]  # (B, k)
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, pred_pos[:, :, None].expand(-1, -1, logp.shape[-1]))  # (B, k, V)
        token_logp = picked.gather(2, self.answer_ids.to(logits.device)[None, :, None].expand(len(prompts), -1, 1))
        log_p = token_logp.squeeze(-1).sum(dim=1)
        return RewardOutput(log_p.exp(), {"log_p_yes": log_p})


def load_vqascore(checkpoint=None, *, weights="pretrained", tiny: bool = False, **options) -> VQAScore:
    from mmreward.models import _qwen_vl

    if tiny:
        from mmreward.models._tiny_qwen_vl import tiny_qwen_vl_folder

        checkpoint = tiny_qwen_vl_folder()  # tiny=True always means the seeded tiny model, never the default hub id
        options.setdefault("max_pixels", 56 * 56)
    if checkpoint is None:
        from mmreward.errors import CheckpointError

        raise CheckpointError("vqascore needs a checkpoint (a VLM folder or hub id), or tiny=True for tests")
    processor = _qwen_vl.load_processor(checkpoint)
    if weights == "random":
        model = _qwen_vl.vlm_from_config(_qwen_vl.load_config(checkpoint))
    else:
        model = _qwen_vl.load_vlm(checkpoint)
    return VQAScore(model, processor, **options)
