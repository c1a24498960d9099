"""ImageReward v1.0: our BLIP modules vs an independent reference built from timm's ViT and transformers'
BlipTextModel (a port of BLIP's med BERT) on the same official-format state dict."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from PIL import Image

import mmreward
from mmreward.testing.tiny_models import build_bert_tokenizer
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.zoo_reference import ZOO_CASES, as_inputs, mixed_pil_images, torchvision_clip_transform

PROMPTS = ["a red circle", "two blue squares above a cat", "a photo of a dog", "a green triangle"]
VIT = {"img_size": 224, "patch_size": 16, "embed_dim": 128, "depth": 2, "num_heads": 2}  # heads 64 wide, as BLIP's
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
MEAN, STD = 0.16717362830052426, 1.0333394966054072


def med_config(vocab_size: int, **dims) -> dict:
    """ImageReward's med_config.json with the given sizes."""
    return {
        "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512, "model_type": "bert", "pad_token_id": 0, "type_vocab_size": 2,
        "vocab_size": vocab_size, "encoder_width": 768, "add_cross_attention": True, **dims,
    }


def reference_models(vocab_size: int):
    from timm.models.vision_transformer import VisionTransformer
    from transformers import BlipTextConfig
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    vit = VisionTransformer(**VIT, mlp_ratio=4.0, qkv_bias=True, num_classes=0, global_pool="",
                            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6)).eval()
    cfg = BlipTextConfig(vocab_size=vocab_size, encoder_hidden_size=VIT["embed_dim"], max_position_embeddings=512,
                         layer_norm_eps=1e-12, hidden_act="gelu", is_decoder=True, pad_token_id=0, **TEXT)
    text = BlipTextModel(cfg, add_pooling_layer=False).eval()  # is_decoder=True only creates cross-attention
    return vit, text


def redraw(sd: dict, g: torch.Generator) -> dict:
    """Well-scaled random values, so that every part of the network moves the score."""
    out = {}
    for k, v in sd.items():
        if not v.is_floating_point():
            out[k] = v
        elif v.ndim >= 2:
            out[k] = torch.randn(v.shape, generator=g) / v.shape[-1] ** 0.5 if "embed" not in k else \
                torch.randn(v.shape, generator=g) * 0.5
        elif k.endswith("weight"):
            out[k] = 1 + 0.1 * torch.randn(v.shape, generator=g)
        else:
            out[k] = 0.1 * torch.randn(v.shape, generator=g)
    return out


@pytest.fixture(scope="module")
def official_folder(tmp_path_factory):
    """ImageReward.pt (plain state dict, official key names) + med_config.json + vocab.txt in one folder."""
    folder = tmp_path_factory.mktemp("imagereward")
    tok = build_bert_tokenizer(folder)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    vocab = len(tok)
    torch.manual_seed(0)
    vit, text = reference_models(vocab)
    g = torch.Generator().manual_seed(1)
    vit.load_state_dict(redraw(vit.state_dict(), g))
    text.load_state_dict(redraw(text.state_dict(), g))
    sd = {f"blip.visual_encoder.{k}": v for k, v in vit.state_dict().items()}
    sd.update({f"blip.text_encoder.{k}": v for k, v in text.state_dict().items()})
    sd["blip.text_encoder.embeddings.position_ids"] = torch.arange(512).expand(1, -1)
    sd["blip.vision_proj.weight"] = torch.randn(256, VIT["embed_dim"], generator=g)
    sd["blip.vision_proj.bias"] = torch.randn(256, generator=g)
    sd["blip.text_proj.weight"] = torch.randn(256, TEXT["hidden_size"], generator=g)
    sd["blip.text_proj.bias"] = torch.randn(256, generator=g)
    head = {}
    for idx, (i, o) in zip([0, 2, 4, 6, 7], [(TEXT["hidden_size"], 1024), (1024, 128), (128, 64), (64, 16), (16, 1)]):
        head[idx] = (torch.randn(o, i, generator=g) / i**0.5, 0.1 * torch.randn(o, generator=g))
        sd[f"mlp.layers.{idx}.weight"], sd[f"mlp.layers.{idx}.bias"] = head[idx]
    torch.save(sd, folder / "ImageReward.pt")
    (folder / "med_config.json").write_text(json.dumps(med_config(vocab, **TEXT)))
    return folder, vit, text, head, tok


def reference_scores(official, images, prompts):
    """ImageReward.score, one image at a time: _transform(224), tokenizer(max_length=35), CLS -> MLP."""
    _, vit, text, head, tok = official
    tf = torchvision_clip_transform(224)
    out = []
    with torch.no_grad():
        for im, p in zip(images, prompts):
            t = tok(p, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
            image_embeds = vit.forward_features(tf(im)[None])
            h = text(input_ids=t["input_ids"], attention_mask=t["attention_mask"], encoder_hidden_states=image_embeds,
                     encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long),
                     is_decoder=False).last_hidden_state[:, 0, :].float()
            for idx in [0, 2, 4, 6, 7]:
                h = h @ head[idx][0].T + head[idx][1]
            out.append((h[:, 0] - MEAN) / STD)
    return torch.cat(out)


@pytest.mark.parity
def test_imagereward_matches_reference_on_all_input_forms(official_folder):
    folder = official_folder[0]
    reward = mmreward.load("imagereward", checkpoint=str(folder))
    wants: dict[int, torch.Tensor] = {}  # the tensor forms share their PIL images: one reference run
    gots, refs = [], []
    for kind, value in as_inputs(mixed_pil_images()).items():
        pil, media = (value, value) if kind == "pil" else value
        ps = PROMPTS[: len(pil)]
        want = (wants[id(pil)] if id(pil) in wants else wants.setdefault(id(pil), reference_scores(official_folder, pil, ps)))
        assert want.std() > 1e-2, "reference scores must vary across inputs for the comparison to mean anything"
        got = reward.score(ps, media).scores
        assert_close_scaled(got, want, rel=1e-5, msg=lambda m, k=kind: f"{k}: {m}")
        gots.append(got.float())
        refs.append(want.float())
    record_parity("imagereward", original="THUDM/ImageReward ImageReward/ImageReward.py score() transcribed on timm "
                  "VisionTransformer + transformers BertModel", how="transcribed", actual=torch.cat(gots),
                  expected=torch.cat(refs), cases=ZOO_CASES)


def test_imagereward_file_path_and_prompt_truncation(official_folder):
    folder = official_folder[0]
    reward = mmreward.load("imagereward", checkpoint=str(folder / "ImageReward.pt"))
    long_prompt = " ".join(["a red circle above a blue square"] * 10)  # far beyond 35 tokens
    images = mixed_pil_images()[:2]
    assert_close_scaled(reward.score(long_prompt, images).scores,
                        reference_scores(official_folder, images, [long_prompt] * 2), rel=1e-5)


def test_imagereward_differentiable_path(official_folder):
    reward = mmreward.load("imagereward", checkpoint=str(official_folder[0]))
    g = torch.Generator().manual_seed(3)
    media = torch.nn.functional.interpolate(torch.rand(2, 3, 6, 6, generator=g), size=(333, 517), mode="bilinear")
    ref = reward.score(PROMPTS[:2], media).scores
    x = media.clone().requires_grad_(True)
    y = reward.score(PROMPTS[:2], x).scores
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    # Pillow-vs-antialiased-torch resize deviation; measured ~1e-3 on these standardised scores (scale ~2)
    assert_close_scaled(y.detach(), ref, rel=1e-2)


def test_imagereward_strict_loading(official_folder, tmp_path):
    import shutil

    folder = official_folder[0]
    for name in ("med_config.json", "vocab.txt"):
        shutil.copy(folder / name, tmp_path / name)
    sd = torch.load(folder / "ImageReward.pt")
    sd["blip.text_encoder.pooler.dense.weight"] = torch.zeros(2, 2)
    torch.save(sd, tmp_path / "ImageReward.pt")
    with pytest.raises(mmreward.CheckpointError, match="unexpected keys.*pooler"):
        mmreward.load("imagereward", checkpoint=str(tmp_path))
    (tmp_path / "ImageReward.pt").unlink()
    with pytest.raises(mmreward.CheckpointError, match="ImageReward.pt"):
        mmreward.load("imagereward", checkpoint=str(tmp_path))


def test_official_geometry_has_the_625_official_tensors():
    """ViT-L/16 + BERT-base med config: exactly the official file's 625 tensors and shapes (meta device)."""
    from mmreward.models.image_reward import ImageRewardModel

    med = med_config(30524, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12)
    vit = {"image_size": 224, "patch_size": 16, "embed_dim": 1024, "depth": 24, "num_heads": 16}
    with torch.device("meta"):
        sd = ImageRewardModel(vit, med).state_dict()
    assert len(sd) == 625
    shapes = {
        "blip.visual_encoder.pos_embed": (1, 197, 1024),
        "blip.visual_encoder.blocks.23.attn.qkv.weight": (3072, 1024),
        "blip.text_encoder.embeddings.word_embeddings.weight": (30524, 768),
        "blip.text_encoder.embeddings.position_ids": (1, 512),
        "blip.text_encoder.encoder.layer.11.crossattention.self.key.weight": (768, 1024),
        "blip.vision_proj.weight": (256, 1024),
        "blip.text_proj.weight": (256, 768),
        "mlp.layers.0.weight": (1024, 768),
        "mlp.layers.7.weight": (1, 16),
    }
    assert {k: tuple(sd[k].shape) for k in shapes} == shapes


def test_imagereward_rgba_differentiable_path_resizes_premultiplied(official_folder):
    import numpy as np

    from tests._helpers.zoo_reference import gradient_alpha_image

    reward = mmreward.load("imagereward", checkpoint=str(official_folder[0]))
    assert reward.image_alpha == "resize_then_drop"
    arr = np.asarray(gradient_alpha_image(333, 517, 2)).copy()
    arr[:, :200, 3] = 0  # a cut-out: colour hidden under alpha 0, which Pillow's premultiplied resize blacks out
    im = Image.fromarray(arr)
    x = torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255
    pil_path = reward.score(PROMPTS[:1], x).scores
    torch.testing.assert_close(pil_path, reference_scores(official_folder, [im], PROMPTS[:1]), atol=1e-5, rtol=0)
    xg = x.clone().requires_grad_(True)
    y = reward.score(PROMPTS[:1], xg).scores
    y.sum().backward()
    assert torch.isfinite(xg.grad).all() and xg.grad[:, :3].abs().sum() > 0
    # the same Pillow-vs-float tolerance as RGB (measured 5e-3 here); dropping alpha first is off by ~0.5
    assert (y.detach() - pil_path).abs().max() < 2e-2
    assert (reward.score(PROMPTS[:1], x[:, :3]).scores - pil_path).abs().max() > 0.1
