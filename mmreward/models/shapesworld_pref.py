"""ShapesWorld preference model: a tiny CLIP fine-tuned PickScore-style on ShapesWorld preference pairs.

score = exp(logit_scale) * cos(image embedding, prompt embedding), as PickScore; `compare` is the
softmax over the two scores of a pair (Bradley-Terry with temperature 1), which is the probability the
model was trained to output. Preprocessing: bicubic (antialiased) resize to the model's image size,
CLIP mean/std, all on tensors, so the score is differentiable with respect to the pixels.
"""

from __future__ import annotations

import tempfile

import torch

from mmreward.types import Reward, RewardOutput


class CLIPPreferenceReward(Reward):
    name = "shapesworld-pref"
    differentiable = True
    # Precision: the towers may run in bf16 on fp32-preprocessed pixels; exp(logit_scale) multiplies every
    # score, so it stays fp32, and the cosine is taken in fp32.
    keep_fp32 = ("model.logit_scale",)

    def __init__(self, model, tokenizer, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.tokenizer = tokenizer
        self.image_size = model.config.vision_config.image_size

    def _score(self, prompts, media):
        from mmreward.synthetic.models import TEXT_LENGTH, normalize_images

        if isinstance(media, list):
            media = torch.stack([
                torch.nn.functional.interpolate(m[None], size=(self.image_size,) * 2, mode="bicubic",
                                                antialias=True, align_corners=False)[0] for m in media
            ])
        tok = self.tokenizer(prompts, padding="max_length", max_length=TEXT_LENGTH, truncation=True,
                             return_tensors="pt").to(self.device)
        img = self.model.get_image_features(pixel_values=normalize_images(media, self.image_size).to(self.dtype))
        txt = self.model.get_text_features(input_ids=tok.input_ids, attention_mask=tok.attention_mask)
        img = getattr(img, "pooler_output", img)
        txt = getattr(txt, "pooler_output", txt)
        cos = torch.nn.functional.cosine_similarity(img.float(), txt.float(), dim=-1)
        return RewardOutput(self.model.logit_scale.float().exp() * cos, {"cosine": cos})


def load_clip_folder(checkpoint: str | None, weights: str):
    """(CLIPModel, tokenizer) from a ShapesWorld CLIP folder, or a random tiny one with weights='random'."""
    from transformers import AutoTokenizer, CLIPModel

    if weights == "random":
        from mmreward.synthetic.models import build_clip
        from mmreward.synthetic.tokenizer import build_shapes_tokenizer

        tok = build_shapes_tokenizer(tempfile.mkdtemp(prefix="shapes_tok_"))
        return build_clip(len(tok)), tok
    from mmreward.checkpoints import load_files, load_pretrained, resolve_files

    files = resolve_files(checkpoint, ["config.json", "model.safetensors", "tokenizer_config.json"],
                          optional=["vocab.json", "merges.txt", "tokenizer.json"])
    folder = str(files["config.json"].parent)
    return load_pretrained(CLIPModel, folder), load_files(AutoTokenizer.from_pretrained, folder, "tokenizer")


def load_shapesworld_pref(checkpoint=None, *, weights="pretrained", **options) -> CLIPPreferenceReward:
    model, tok = load_clip_folder(checkpoint, weights)
    return CLIPPreferenceReward(model.float().eval(), tok, **options)
