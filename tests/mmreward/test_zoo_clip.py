"""CLIPScore, PickScore and the LAION aesthetic predictor against per-image reference pipelines.

Each test writes random weights in the official format (transformers CLIP folders, open_clip hub
folders, the aesthetic head .pth), loads them through mmreward.load(name, checkpoint=path), and checks
the scores against the reference recipe written in tests/_helpers/zoo_reference.py to 1e-5 of their scale.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

import mmreward
from mmreward.testing.tiny_models import save_tiny_transformers_clip
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.zoo_reference import (
    ZOO_CASES,
    as_inputs,
    hf_clip_pixels,
    mixed_pil_images,
    torchvision_clip_transform,
)

PROMPTS = ["a red circle", "two blue squares", "a photo of a cat", "a green triangle"]
# against a reference pipeline: float32 noise measured at 2e-7 to 6e-7 of the scores' scale
REL = 1e-5


@pytest.fixture(scope="module")
def hf_clip_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_clip")
    save_tiny_transformers_clip(path, image_size=224, patch_size=32, seed=3)
    return path


@pytest.fixture(scope="module")
def open_clip_dir(tmp_path_factory):
    """open_clip's hub layout: open_clip_config.json + open_clip_model.safetensors."""
    from open_clip.model import CLIP
    from safetensors.torch import save_file

    cfg = {
        "embed_dim": 16,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16, "patch_size": 32},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
    }
    torch.manual_seed(5)
    model = CLIP(**cfg)
    path = tmp_path_factory.mktemp("open_clip")
    (path / "open_clip_config.json").write_text(json.dumps({
        "model_cfg": cfg,
        "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073],
                           "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic",
                           "resize_mode": "shortest"},
    }))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "open_clip_model.safetensors"))
    return path


@functools.lru_cache(maxsize=4)
def _hf_reference_model(folder):
    from transformers import CLIPModel, CLIPTokenizerFast

    return CLIPModel.from_pretrained(str(folder)).eval(), CLIPTokenizerFast.from_pretrained(str(folder))


def hf_reference_cos(folder, images, prompts) -> torch.Tensor:
    """torchmetrics-style per-image CLIP forward: PIL processor, tokenizer, normalised embeddings."""
    model, tok = _hf_reference_model(folder)
    out = []
    with torch.no_grad():
        for pixels, prompt in zip(hf_clip_pixels(images), prompts):
            t = tok([prompt], padding=True, truncation=True, max_length=77, return_tensors="pt")
            o = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], pixel_values=pixels)
            out.append((o.image_embeds * o.text_embeds).sum(-1))
    return torch.cat(out), model.logit_scale.exp().item()


def check_all_inputs(reward, reference_fn, prompts=PROMPTS, parity=None):
    """Score every input form and compare with the per-image reference on the equivalent PIL images.

    `parity`: (family, original, how) to record the comparison for the parity table (tests/_helpers/parity_record.py)."""
    images = mixed_pil_images()
    wants: dict[int, torch.Tensor] = {}  # the tensor forms share their PIL images: one reference run
    gots, refs = [], []
    for kind, value in as_inputs(images).items():
        pil, media = (value, value) if kind == "pil" else value
        ps = prompts[: len(pil)]
        got = reward.score(ps, media).scores
        want = wants[id(pil)] if id(pil) in wants else wants.setdefault(id(pil), reference_fn(pil, ps))
        assert_close_scaled(got, want.float(), rel=REL, msg=lambda m, k=kind: f"{k}: {m}")
        gots.append(got.float().flatten())
        refs.append(want.float().flatten())
    if parity is not None:
        family, original, how = parity
        record_parity(family, original=original, how=how, actual=torch.cat(gots), expected=torch.cat(refs),
                      cases=ZOO_CASES)


# ----------------------------------------------------------------------------------------------
# CLIPScore
# ----------------------------------------------------------------------------------------------
@pytest.mark.parity
def test_clipscore_transformers_matches_reference(hf_clip_dir):
    reward = mmreward.load("clipscore", checkpoint=str(hf_clip_dir))

    def ref(pil, prompts):
        cos, _ = hf_reference_cos(hf_clip_dir, pil, prompts)
        return (100 * cos).clamp(min=0)

    check_all_inputs(reward, ref, parity=("clipscore (transformers CLIP)", f"transformers=={transformers.__version__} "
                                          "CLIPModel + CLIPProcessor (Hessel et al. 2021 w=100 convention)",
                                          "package"))
    # a prompt whose cosine has both signs across the images exercises the per-sample clamp
    out = reward.score("the the the", mixed_pil_images())
    cos = out.details["cosine"]
    assert cos.min() < 0 < cos.max()
    assert_close_scaled(out.scores, torch.where(cos > 0, 100 * cos, torch.zeros_like(cos)), rel=1e-6)


def test_clip_s_convention_and_prefix(hf_clip_dir):
    reward = mmreward.load("clipscore", checkpoint=str(hf_clip_dir), convention="clip-s")
    images = mixed_pil_images()
    cos, _ = hf_reference_cos(hf_clip_dir, images, ["A photo depicts " + p for p in PROMPTS])
    assert_close_scaled(reward.score(PROMPTS, images).scores, 2.5 * cos.clamp(min=0), rel=REL)


@pytest.mark.parity
def test_clipscore_open_clip_matches_reference(open_clip_dir):
    import open_clip

    reward = mmreward.load("clipscore", checkpoint=str(open_clip_dir))
    # the reference package's own loader and tokenizer on the same folder
    model = open_clip.create_model(f"local-dir:{open_clip_dir}").eval()
    tok = open_clip.get_tokenizer(f"local-dir:{open_clip_dir}")
    # open_clip's own eval transform: Resize, CenterCrop, then convert("RGB") (RGBA resized premultiplied)
    tf = open_clip.image_transform(224, is_train=False, resize_mode="shortest", interpolation="bicubic")

    def ref(pil, prompts):
        out = []
        with torch.no_grad():
            for im, p in zip(pil, prompts):
                a = F.normalize(model.encode_image(tf(im)[None]), dim=-1)
                b = F.normalize(model.encode_text(tok([p])), dim=-1)
                out.append((100 * (a * b).sum(-1)).clamp(min=0))
        return torch.cat(out)

    check_all_inputs(reward, ref, parity=("clipscore (open_clip)", f"open_clip_torch=={open_clip.__version__} "
                                          "create_model + image_transform", "package"))


def test_clipscore_bad_inputs_and_backbone(hf_clip_dir, tmp_path):
    with pytest.raises(mmreward.ConfigError, match="convention"):
        mmreward.load("clipscore", checkpoint=str(hf_clip_dir), convention="paper")
    with pytest.raises(mmreward.CheckpointError, match="config.json"):
        mmreward.load("clipscore", checkpoint=str(tmp_path))


def test_text_embeddings_cached_per_unique_prompt(hf_clip_dir):
    reward = mmreward.load("clipscore", checkpoint=str(hf_clip_dir))
    cache = reward.backbone.text_cache
    media = torch.rand(8, 3, 64, 64)
    first = reward.score(["a cat"] * 4 + ["a dog"] * 4, media).scores
    assert (cache.misses, len(cache)) == (2, 2)
    again = reward.score(["a dog"] * 4 + ["a cat"] * 4, media.flip(0)).scores
    assert cache.misses == 2 and cache.hits == 14
    assert_close_scaled(again, first.flip(0), rel=1e-6)


def test_micro_batching_does_not_change_scores(hf_clip_dir):
    big = mmreward.load("clipscore", checkpoint=str(hf_clip_dir), micro_batch_size=32)
    small = mmreward.load("clipscore", checkpoint=str(hf_clip_dir), micro_batch_size=3)
    media = torch.rand(5, 3, 48, 64)
    assert_close_scaled(small.score(PROMPTS[0], media).scores, big.score(PROMPTS[0], media).scores, rel=REL)


def test_bf16_opt_in(hf_clip_dir):
    fp32 = mmreward.load("clipscore", checkpoint=str(hf_clip_dir))
    bf16 = mmreward.load("clipscore", checkpoint=str(hf_clip_dir), dtype="bf16")
    assert bf16.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    media = torch.rand(4, 3, 64, 64)
    a, b = fp32.score(PROMPTS, media).details["cosine"], bf16.score(PROMPTS, media).details["cosine"]
    assert b.dtype == torch.float32
    torch.testing.assert_close(b, a, atol=0.05, rtol=0)  # bf16 keeps ~3 significant digits


# ----------------------------------------------------------------------------------------------
# differentiable path
# ----------------------------------------------------------------------------------------------
# Pillow (uint8, fixed point) vs F.interpolate(antialias=True) on floats: measured max |delta cos| of
# 2e-4 to 4e-4 for the tiny random CLIP on 160x200 to 1024x768 inputs; we allow 2e-3.
DIFF_COS_TOL = 2e-3


@pytest.mark.parametrize("name", ["clipscore", "pickscore"])
def test_differentiable_path_gradients_and_agreement(hf_clip_dir, name):
    reward = mmreward.load(name, checkpoint=str(hf_clip_dir))
    g = torch.Generator().manual_seed(1)
    media = torch.nn.functional.interpolate(torch.rand(3, 3, 6, 6, generator=g), size=(333, 517), mode="bilinear")
    ref = reward.score(PROMPTS[:3], media).details["cosine"]
    x = media.clone().requires_grad_(True)
    out = reward.score(PROMPTS[:3], x)
    assert out.scores.requires_grad
    out.scores.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    delta = (out.details["cosine"].detach() - ref).abs().max().item()
    assert delta < DIFF_COS_TOL, f"differentiable path deviates by {delta:.2e} in cosine"


# ----------------------------------------------------------------------------------------------
# PickScore
# ----------------------------------------------------------------------------------------------
@pytest.mark.parity
def test_pickscore_single_folder_matches_reference(hf_clip_dir):
    reward = mmreward.load("pickscore", checkpoint=str(hf_clip_dir))

    def ref(pil, prompts):
        cos, scale = hf_reference_cos(hf_clip_dir, pil, prompts)
        return scale * cos

    check_all_inputs(reward, ref, parity=("pickscore", "yuvalkirstain/PickScore README inference snippet "
                                          f"(logit_scale * cos) on transformers=={transformers.__version__}",
                                          "package"))


def test_pickscore_split_model_and_processor(hf_clip_dir, tmp_path):
    """The official split: model repo without processor files, processor+tokenizer in another repo."""
    import shutil

    model_dir, proc_dir = tmp_path / "model", tmp_path / "processor"
    model_dir.mkdir()
    proc_dir.mkdir()
    for f in hf_clip_dir.iterdir():
        is_model = f.name in ("config.json", "model.safetensors")
        shutil.copy(f, (model_dir if is_model else proc_dir) / f.name)
    json.loads((proc_dir / "preprocessor_config.json").read_text())
    split = mmreward.load("pickscore", checkpoint=str(model_dir), processor=str(proc_dir))
    single = mmreward.load("pickscore", checkpoint=str(hf_clip_dir))
    media = mixed_pil_images()
    assert_close_scaled(split.score(PROMPTS, media).scores, single.score(PROMPTS, media).scores, rel=1e-6)
    with pytest.raises(mmreward.CheckpointError, match="tokenizer"):
        mmreward.load("pickscore", checkpoint=str(model_dir), processor=str(model_dir))


def test_pickscore_compare_and_rank_are_softmax_over_candidates(hf_clip_dir):
    reward = mmreward.load("pickscore", checkpoint=str(hf_clip_dir))
    media = torch.rand(6, 3, 64, 64)
    prompts = ["a cat"] * 3 + ["a dog"] * 3
    out = reward.rank(prompts, media)
    s = out.scores
    want = torch.cat([torch.softmax(s[:3], 0), torch.softmax(s[3:], 0)])
    torch.testing.assert_close(out.details["prob"], want, atol=1e-6, rtol=0)
    pair = reward.compare("a cat", media[:2], media[2:4])
    want_pair = torch.softmax(torch.stack([pair.score_a, pair.score_b]), dim=0)[0]
    torch.testing.assert_close(pair.prob_a, want_pair, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------
# LAION aesthetic predictor v2
# ----------------------------------------------------------------------------------------------
@pytest.mark.parity
def test_aesthetic_single_folder_matches_reference(hf_clip_dir, tmp_path):
    import shutil

    from transformers import CLIPModel

    folder = tmp_path / "aesthetic"
    shutil.copytree(hf_clip_dir, folder)
    dim = CLIPModel.from_pretrained(str(hf_clip_dir)).config.projection_dim
    g = torch.Generator().manual_seed(11)
    sizes = [(dim, 1024), (1024, 128), (128, 64), (64, 16), (16, 1)]
    head = {}
    for idx, (i, o) in zip([0, 2, 4, 6, 7], sizes):
        head[f"layers.{idx}.weight"] = torch.randn(o, i, generator=g) / i**0.5
        head[f"layers.{idx}.bias"] = torch.randn(o, generator=g) * 0.1
    torch.save(head, folder / "sac+logos+ava1-l14-linearMSE.pth")
    reward = mmreward.load("aesthetic", checkpoint=str(folder))
    model = CLIPModel.from_pretrained(str(folder)).eval()
    tf = torchvision_clip_transform(224)  # the predictor used OpenAI CLIP's torchvision preprocessing

    def ref(pil, prompts):
        out = []
        with torch.no_grad():
            for im in pil:
                emb = model.visual_projection(model.vision_model(pixel_values=tf(im)[None]).pooler_output).numpy()
                x = torch.from_numpy(emb / np.linalg.norm(emb, 2, axis=-1, keepdims=True))
                for idx in [0, 2, 4, 6, 7]:
                    x = x @ head[f"layers.{idx}.weight"].T + head[f"layers.{idx}.bias"]
                out.append(x[:, 0])
        return torch.cat(out)

    check_all_inputs(reward, ref, prompts=[""] * 4,
                     parity=("aesthetic", "christophschuhmann/improved-aesthetic-predictor simple_inference.py "
                             "(OpenAI CLIP torchvision preprocess, L2-normalised embedding, MLP)", "transcribed"))
    assert reward.score(None, torch.rand(2, 3, 64, 64)).scores.shape == (2,)


def test_differentiable_path_on_mixed_size_list(hf_clip_dir):
    reward = mmreward.load("clipscore", checkpoint=str(hf_clip_dir))
    xs = [torch.rand(3, 100, 150).requires_grad_(True), torch.rand(3, 333, 517).requires_grad_(True)]
    out = reward.score(["a cat", "a dog"], xs)
    out.details["cosine"].sum().backward()  # the clamped score has no gradient where cos < 0
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in xs)
    ref = reward.score(["a cat", "a dog"], [x.detach() for x in xs]).details["cosine"]
    assert (out.details["cosine"].detach() - ref).abs().max() < DIFF_COS_TOL


@pytest.mark.parametrize("name,backbone,convention", [
    ("clipscore", "transformers", "drop_first"),
    ("clipscore", "open_clip", "resize_then_drop"),
    ("pickscore", "transformers", "drop_first"),
])
def test_alpha_convention_and_rgb_scores_unchanged(hf_clip_dir, open_clip_dir, name, backbone, convention):
    from tests._helpers.zoo_reference import gradient_alpha_image

    reward = mmreward.load(name, checkpoint=str(hf_clip_dir if backbone == "transformers" else open_clip_dir))
    assert reward.image_alpha == convention
    im = gradient_alpha_image(333, 517, 2)
    opaque = im.copy()
    opaque.putalpha(255)
    got = reward.score(PROMPTS[0], [im, opaque, im.convert("RGB")]).details["cosine"]
    assert got[1] == got[2], "an opaque alpha channel must not change the score"
    if convention == "drop_first":
        assert got[0] == got[2]
    else:
        assert (got[0] - got[2]).abs() > 1e-4
