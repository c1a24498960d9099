"""Using the shipped ShapesWorld VQA policy (assets/shapesworld/vqa-policy): its question kinds, prompts, image
rendering, greedy answers and the gold checker. Shared by its asset recipe (`synthetic/build/train_vqa_policy.py`)
and the TRL recipe (`vlm_rm.trl_shapes_vqa`), so the library never imports an asset-training script."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch

POLICY_KINDS: tuple[str, ...] = ("count", "color", "shape", "position", "which")
IMAGE_SIZE = 56  # a multiple of 28: 4x4 patches of 14 pixels, 4 visual tokens per image after the 2x2 merge (one per
# cell of the scenes' 2x2 grid); the shipped policy's side (84 gives 9 tokens; see train_vqa_policy)


def chat_prompt(item) -> list[dict[str, Any]]:
    """The user turn as trl's dataset holds it (`vqa.to_trl_rows(..., answer_format=False)`)."""
    content = [{"type": "image"} for _ in item.scenes] + [{"type": "text", "text": item.question}]
    return [{"role": "user", "content": content}]


def policy_image_size(processor) -> int:
    """The side of the square images a policy's processor was saved for (min = max pixels, no resize)."""
    size = processor.image_processor.size
    return int(round(math.sqrt(size["longest_edge"] if "longest_edge" in size else size["max_pixels"])))


def render_items(items, size: int | None = None, processor=None) -> tuple[list[list[Any]], torch.Tensor]:
    """Every item's images as PIL (what the processor and trl read) and each item's first image as a
    (N, 3, S, S) tensor in [0, 1] (the 8-bit pixels the gold checker reads). The side S is `size`, else the
    one `processor` was saved for, else IMAGE_SIZE."""
    import numpy as np

    from mmreward.synthetic.vqa import render_grouped

    side = size or (policy_image_size(processor) if processor is not None else IMAGE_SIZE)
    pils = render_grouped(items, side)
    first = torch.from_numpy(np.stack([np.asarray(p[0]) for p in pils])).permute(0, 3, 1, 2).float() / 255
    return pils, first


def prompt_texts(processor, items) -> list[str]:
    return [processor.apply_chat_template(chat_prompt(it), add_generation_prompt=True, tokenize=False)
            for it in items]


def flat_images(items, images: Sequence[list[Any]] | None) -> list[Any]:
    images = images if images is not None else render_items(items)[0]
    return [im for ims in images for im in ims]


@torch.inference_mode()
def generate_answers(model, processor, items, images: Sequence[list[Any]] | None = None, *, max_new_tokens: int = 4,
                     do_sample: bool = False, temperature: float = 1.0, batch_size: int = 128) -> list[str]:
    """The policy's answers to `items` (greedy unless do_sample), decoded without special tokens."""
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    out: list[str] = []
    try:
        for s in range(0, len(items), batch_size):
            chunk = items[s:s + batch_size]
            ims = flat_images(chunk, None if images is None else images[s:s + batch_size])
            enc = processor(text=prompt_texts(processor, chunk), images=ims, return_tensors="pt", padding=True)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature if do_sample else None, top_p=None, top_k=None,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            out += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return [a.strip() for a in out]


def gold_correct(items, answers: Sequence[str], first_images: torch.Tensor | None = None) -> torch.Tensor:
    """1/0 per answer from the `shapes-vqa` exact checker, given the items' reference answers.

    first_images: each item's first image (`render_items(items)[1]`); 'which' answers are checked against
    the reference, the other kinds' references agree with the image (tests/mmreward/test_shapes_vqa.py)."""
    from mmreward.models.shapes_vqa import ShapesVQAReward

    reward = ShapesVQAReward()
    media = first_images if first_images is not None else render_items(items)[1]
    return reward.score_responses([it.question for it in items], media, list(answers),
                                  references=[it.answer for it in items]).scores


def accuracy(correct: torch.Tensor) -> tuple[float, float]:
    """(mean, binomial standard error)."""
    p, n = float(correct.float().mean()), correct.numel()
    return p, math.sqrt(max(p * (1 - p), 1e-12) / n)


def eval_items(n: int, split: str = "heldout", seed: int = 1, kinds: Sequence[str] = POLICY_KINDS) -> list:
    """The fixed evaluation questions: `n` of `split` (kinds in turn), seeded apart from the training seeds."""
    from mmreward.synthetic.vqa import make_questions

    return make_questions(n, seed=seed, split=split, kinds=tuple(kinds))


def shuffled_within_kind(items, images: Sequence[Any], seed: int = 0) -> list:
    """`images` re-dealt among the items of each kind (a seeded permutation per kind): every question gets the
    images of another question of its kind. Accuracy on these is what the question text alone earns (the
    label prior); a policy that reads the image loses accuracy here, one that does not keeps it."""
    rng = random.Random(seed)
    out = list(images)
    for kind in sorted({it.kind for it in items}):
        idx = [i for i, it in enumerate(items) if it.kind == kind]
        perm = idx[:]
        rng.shuffle(perm)
        for i, j in zip(idx, perm):
            out[i] = images[j]
    return out
