"""HPSv2 / HPSv2.1: official {'state_dict': fp16} files loaded strictly, scores vs the HPSv2 recipe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mmreward
from tests._helpers.parity_record import record_parity
from tests._helpers.zoo_reference import ZOO_CASES, as_inputs, hps_pixels, mixed_pil_images

PROMPTS = ["a red circle", "two blue squares", "a photo of a cat", "a green triangle"]
# small widths, real key layout and real preprocessing geometry (224)
CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 32, "head_width": 16, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def write_hps_file(path, cfg, seed):
    from open_clip.model import CLIP

    torch.manual_seed(seed)
    model = CLIP(**cfg)
    sd = {k: v.half() for k, v in model.state_dict().items()}  # the "compressed" files are fp16
    torch.save({"state_dict": sd}, path)
    return sd


@pytest.fixture(scope="module")
def hps_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hps")
    sds = {
        "hpsv2": write_hps_file(folder / "HPS_v2_compressed.pt", CFG, 1),
        "hpsv2.1": write_hps_file(folder / "HPS_v2.1_compressed.pt", CFG, 2),
    }
    return folder, sds


def reference_scores(sd, images, prompts):
    """hpsv2.score: preprocess_val per image, model(image, text) features, diagonal of image @ text.T."""
    import open_clip
    from open_clip.model import CLIP

    model = CLIP(**CFG).eval()
    model.load_state_dict(sd)
    model.float()
    tok = open_clip.get_tokenizer("ViT-H-14")
    out = []
    with torch.no_grad():
        for im, p in zip(images, prompts):
            pixels = hps_pixels(im)
            if pixels.shape[1] == 4:  # the original cannot score RGBA; our documented convention drops alpha first
                pixels = hps_pixels(im.convert("RGB"))
            a = F.normalize(model.encode_image(pixels), dim=-1)
            b = F.normalize(model.encode_text(tok([p])), dim=-1)
            out.append((a @ b.T).diagonal())
    return torch.cat(out)


@pytest.mark.parity
@pytest.mark.parametrize("name", ["hpsv2", "hpsv2.1"])
def test_hps_matches_reference_on_all_input_forms(hps_folder, name):
    import open_clip

    folder, sds = hps_folder
    reward = mmreward.load(name, checkpoint=str(folder), model_cfg=CFG)
    wants: dict[int, torch.Tensor] = {}  # the tensor forms share their PIL images: one reference run
    gots, refs = [], []
    for kind, value in as_inputs(mixed_pil_images()).items():
        pil, media = (value, value) if kind == "pil" else value
        if kind == "float_offgrid":
            continue  # HPSv2 resizes float tensors itself: off-grid floats have no PIL equivalent
        ps = PROMPTS[: len(pil)]
        got = reward.score(ps, media).scores
        want = wants[id(pil)] if id(pil) in wants else wants.setdefault(id(pil), reference_scores(sds[name], pil, ps))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=lambda m, k=kind: f"{k}: {m}")
        gots.append(got.float())
        refs.append(want.float())
    record_parity(name, original=f"tgxs002/HPSv2 hpsv2/img_score.py score() recipe on open_clip_torch=="
                  f"{open_clip.__version__}", how="transcribed", actual=torch.cat(gots), expected=torch.cat(refs),
                  cases=ZOO_CASES, not_checked="RGBA: HPSv2 feeds 4 channels and raises; we drop alpha (our choice)")


def test_hps_versions_pick_their_file(hps_folder):
    folder, _ = hps_folder
    media = torch.rand(2, 3, 100, 150)
    a = mmreward.load("hpsv2", checkpoint=str(folder), model_cfg=CFG).score("a cat", media).scores
    b = mmreward.load("hpsv2.1", checkpoint=str(folder), model_cfg=CFG).score("a cat", media).scores
    assert not torch.allclose(a, b)
    single = mmreward.load("hpsv2", checkpoint=str(folder / "HPS_v2.1_compressed.pt"), model_cfg=CFG)
    torch.testing.assert_close(single.score("a cat", media).scores, b, atol=1e-6, rtol=0)


def test_hps_differentiable_path_is_the_same_computation(hps_folder):
    folder, _ = hps_folder
    reward = mmreward.load("hpsv2", checkpoint=str(folder), model_cfg=CFG)
    media = torch.rand(3, 3, 333, 517)
    ref = reward.score(PROMPTS[:3], media).scores
    x = media.clone().requires_grad_(True)
    y = reward.score(PROMPTS[:3], x).scores
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    torch.testing.assert_close(y.detach(), ref, atol=1e-6, rtol=0)


def test_hps_strict_loading_names_the_problem(tmp_path, hps_folder):
    _, sds = hps_folder
    bad = dict(sds["hpsv2"])
    bad.pop("visual.proj")
    torch.save({"state_dict": bad}, tmp_path / "HPS_v2_compressed.pt")
    with pytest.raises(mmreward.CheckpointError, match="missing keys.*visual.proj"):
        mmreward.load("hpsv2", checkpoint=str(tmp_path), model_cfg=CFG)
    torch.save(sds["hpsv2"], tmp_path / "plain.pt")  # not wrapped in {'state_dict': ...}
    with pytest.raises(mmreward.CheckpointError, match="state_dict"):
        mmreward.load("hpsv2", checkpoint=str(tmp_path / "plain.pt"), model_cfg=CFG)
    with pytest.raises(mmreward.CheckpointError, match="HPS_v2.1_compressed.pt"):
        mmreward.load("hpsv2.1", checkpoint=str(tmp_path), model_cfg=CFG)


@pytest.mark.slow
def test_hps_real_vit_h14_geometry(tmp_path):
    """The real ViT-H-14 architecture (986M parameters) from a random official-format file."""
    import open_clip

    cfg = open_clip.get_model_config("ViT-H-14")
    sd = write_hps_file(tmp_path / "HPS_v2.1_compressed.pt", cfg, 0)
    assert len(sd) == 686  # 32 vision + 24 text blocks of 12 tensors, plus 14 embeddings, norms, projections
    reward = mmreward.load("hpsv2.1", checkpoint=str(tmp_path))
    out = reward.score(["a cat", "a dog"], torch.rand(2, 3, 256, 200)).scores
    assert out.shape == (2,) and torch.isfinite(out).all()
