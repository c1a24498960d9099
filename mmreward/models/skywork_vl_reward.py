"""skywork-vl-reward: Skywork-VL-Reward-7B, a scalar reward for an MLLM's response to a question about an image.

The original (Skywork/Skywork-VL-Reward-7B model card; Wang et al. 2025, arXiv:2505.07263) is Qwen2.5-VL-7B-Instruct
wrapped in TRL's `AutoModelForCausalLMWithValueHead`. How it scores, and how we follow it:
1. the conversation is [user: (image, question), assistant: response], rendered by the processor's chat template
   with `add_generation_prompt=False` (so it ends "...response<|im_end|>\\n" after the default system turn);
2. the image goes through qwen_vl_utils `fetch_image`: RGB, Qwen `smart_resize` with the default 4..16384 visual
   tokens (min_pixels 4*28*28, max_pixels 16384*28*28), Pillow's 8-bit bicubic; here `qwen_vl.resize_for_qwen`
   with method "pillow" (bit-exact) on our [0, 1] tensors;
3. the full Qwen2.5-VL forward (its 3-D M-RoPE positions, unlike HPSv3's sequential ones), last layer's hidden
   states after the final norm (`hidden_states[-1]`);
4. TRL's `ValueHead`: dropout (off in eval) then `summary`, a Linear(hidden, 1) kept in float32 (TRL builds it in
   fp32 and upcasts the hidden states);
5. the score is the value at the LAST token of the sequence (`attention_mask.sum(-1) - 1`, the final "\\n"),
   unscaled (about 20-25 for a good answer on the model card's demo; higher is better).

Checkpoint layout: the hub repo is a `save_pretrained` Qwen2.5-VL folder (config, processor, safetensors shards)
plus `value_head.safetensors` holding `v_head.summary.weight` (1, hidden) and `v_head.summary.bias` (1,). Both are
loaded strictly. Batches are right-padded, so each item's last real token is its `attention_mask` count - 1, as
in the original's batch of one. `select_best_responses` does best-of-N over candidate responses (argmax per item).
Checked against a transcription of the original's path in tests/mmreward/test_parity_skywork_vl_reward.py.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmreward.checkpoints import load_state_dict, load_strict, resolve_files
from mmreward.errors import RewardInputError
from mmreward.types import ResponseReward, RewardOutput

DEFAULT_CHECKPOINT = "Skywork/Skywork-VL-Reward-7B"
VALUE_HEAD_FILE = "value_head.safetensors"
# qwen_vl_utils' defaults (MIN_PIXELS, MAX_PIXELS), which the model card keeps: 4 to 16384 visual tokens
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28


class ValueHead(nn.Module):
    """TRL's ValueHead as the checkpoint names it (`v_head.summary`); its dropout is a no-op at inference."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.summary = nn.Linear(hidden, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # TRL upcasts to the head's dtype (fp32) "for numerical stability"
        return self.summary(hidden_states.to(self.summary.weight.dtype)).squeeze(-1)


class SkyworkVLReward(ResponseReward):
    name = "skywork-vl-reward"
    modalities = ("image",)
    requires_prompt = False  # a response to no question (a caption) is scored with an empty question
    keep_fp32 = ("v_head",)

    def __init__(self, vlm, processor, v_head: ValueHead, *, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS, micro_batch_size: int = 4) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        if not (isinstance(min_pixels, int) and isinstance(max_pixels, int) and 0 < min_pixels <= max_pixels):
            raise RewardInputError(f"min_pixels/max_pixels must be ints with 0 < min <= max, got {min_pixels}, {max_pixels}")
        self.vlm = vlm
        self.processor = processor
        self.v_head = v_head
        self.min_pixels, self.max_pixels = min_pixels, max_pixels

    def _images(self, media: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
        from mmreward.backbones.qwen_vl import qwen_vl_to_rgb, resize_for_qwen

        return [resize_for_qwen(qwen_vl_to_rgb(m), self.min_pixels, self.max_pixels, "pillow") for m in media]

    @property
    def image_alpha(self) -> str:
        # keep RGBA's alpha through `prepare`: the original composites it on white (`qwen_vl_to_rgb`)
        # only for PIL mode "RGBA": to_rgb convert("RGB")s LA and palette images, dropping their transparency
        return "white_background_if_rgba"

    def conversations(self, questions: Sequence[str], responses: Sequence[str]) -> list[list[dict[str, Any]]]:
        """The model card's messages: the user turn holds the image then the question; the assistant turn the response."""
        return [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]},
                 {"role": "assistant", "content": r}] for q, r in zip(questions, responses)]

    def _score_responses(self, questions, media, responses, references):
        from mmreward.backbones.qwen_vl import model_inputs

        texts = self.processor.apply_chat_template(self.conversations(questions, responses), tokenize=False,
                                                   add_generation_prompt=False)
        # 8-bit values from the Pillow-exact resize: the processor rescales them, as it does the original's PIL images
        batch = self.processor(text=texts, images=self._images(media), padding=True, return_tensors="pt",
                               images_kwargs={"do_rescale": True, "do_resize": False})
        inputs = model_inputs(batch, self.device, self.dtype)
        mask = inputs["attention_mask"]
        if bool((mask[:, 0] == 0).any()):  # the last-token index below assumes right padding
            raise RewardInputError("skywork-vl-reward: the processor padded on the left; load it with padding_side='right'")
        # the full forward (M-RoPE positions as Qwen2.5-VL computes them); the final-normed last layer
        hidden = self.vlm.model(**inputs, use_cache=False).last_hidden_state
        last = mask.long().sum(dim=-1) - 1  # the original's index: attention_mask.sum(-1) - 1
        states = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return RewardOutput(self.v_head(states).float())


def select_best_responses(
    reward: ResponseReward, questions: Sequence[str], media: Any, candidates: Sequence[Sequence[str]],
) -> tuple[list[int], list[torch.Tensor]]:
    """Best-of-N: score every candidate response of item i (its question and medium repeated) and pick the argmax.

    Returns (index of the best candidate per item, the candidates' scores per item). Ties go to the first."""
    if len(questions) != len(candidates):
        raise RewardInputError(f"candidates: expected one list per question ({len(questions)}), got {len(candidates)}")
    if any(len(c) == 0 for c in candidates):
        raise RewardInputError("candidates: every item needs at least one candidate response")
    batch = reward.prepare(media, None)
    items = list(batch)
    if len(items) != len(questions):
        raise RewardInputError(f"media: expected one medium per question ({len(questions)}), got {len(items)}")
    flat_q, flat_m, flat_r = [], [], []
    for q, m, cands in zip(questions, items, candidates):
        flat_q += [q] * len(cands)
        flat_m += [m] * len(cands)
        flat_r += list(cands)
    scores = reward.score_responses(flat_q, flat_m, flat_r).scores
    per_item = list(torch.split(scores, [len(c) for c in candidates]))
    return [int(s.argmax()) for s in per_item], per_item


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------
def _text_hidden(vlm) -> int:
    cfg = vlm.config
    return getattr(cfg, "text_config", cfg).hidden_size


def load_value_head(path: str | os.PathLike, hidden: int) -> ValueHead:
    """`value_head.safetensors` in TRL's key layout (v_head.summary.weight / .bias), strictly, into fp32."""
    head = ValueHead(hidden)
    sd = load_state_dict(path)
    load_strict(head, {k: v.float() for k, v in sd.items()}, str(path), strip_prefix="v_head.")
    return head


def write_tiny_skywork_vl_reward(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A tiny random Skywork-VL-Reward checkpoint in the official layout: a save_pretrained Qwen2.5-VL folder
    (processor bounds 28*28..112*112 pixels) plus `value_head.safetensors` (bf16, TRL's key names)."""
    from safetensors.torch import save_file

    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    out = Path(folder)
    model, _ = build_tiny_qwen_vl(out, variant="qwen2_5_vl", seed=seed, max_pixels=112 * 112)
    hidden = _text_hidden(model)
    gen = torch.Generator().manual_seed(seed + 1)
    # a large weight makes the tiny model's scores spread visibly with the image and the response
    weight = torch.randn(1, hidden, generator=gen) * 2.0
    bias = torch.randn(1, generator=gen)
    save_file({"v_head.summary.weight": weight.to(torch.bfloat16), "v_head.summary.bias": bias.to(torch.bfloat16)},
              str(out / VALUE_HEAD_FILE))
    return out


def load_skywork_vl_reward(checkpoint: str | os.PathLike | None = None, *, weights: str = "pretrained",
                           tiny: bool = False, **options: Any) -> SkyworkVLReward:
    from mmreward.backbones import qwen_vl

    if tiny:
        import tempfile

        checkpoint = str(write_tiny_skywork_vl_reward(tempfile.mkdtemp(prefix="mmreward-tiny-skywork-vl-")))
        options.setdefault("min_pixels", 28 * 28)
        options.setdefault("max_pixels", 112 * 112)
    source = os.fspath(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT
    processor = qwen_vl.load_processor(source, padding_side="right")
    if weights == "pretrained":
        vlm = qwen_vl.load_vlm(source)
        path = resolve_files(source, [VALUE_HEAD_FILE])[VALUE_HEAD_FILE]
        head = load_value_head(path, _text_hidden(vlm))
    elif weights == "random":
        vlm = qwen_vl.vlm_from_config(qwen_vl.load_config(source))
        head = ValueHead(_text_hidden(vlm))
    else:
        raise RewardInputError(f"weights must be 'pretrained' or 'random', got {weights!r}")
    return SkyworkVLReward(vlm, processor, head.eval(), **options)
