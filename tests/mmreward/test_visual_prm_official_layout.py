"""visual-prm on the official VisualPRM-8B layout (remote-code InternVLChatModel: InternViT + mlp1 + InternLM2).

One tiny random model is written twice (tests/_helpers/internvl_chat_reference.py): in transformers' native
InternVL layout and in the official layout (InternLM2 / InternViT names, packed `wqkv` with 2 key/value heads for 4
query heads, packed `qkv`, the InternVLChatModel config.json, two safetensors shards and an index, the tokenizer
config naming the remote `InternLM2Tokenizer`, remote-code files that leave a mark if imported). Checks:
- the converted model's language-model logits equal a transcription of the ORIGINAL InternLM2 forward
  (OpenGVLab/InternVL@2410d1d modeling_internlm2.py) on the official tensors, with dynamic-NTK rope below and above
  max_position_embeddings; its image features equal a transcription of InternViT + pixel_shuffle + mlp1
  (modeling_intern_vit.py, modeling_internvl_chat.py there), for the VisualPRM-8B tower (layer norm, no q/k norm)
  and the InternViT-6B style one (RMSNorm, q/k norm);
- visual-prm's step scores from the official folder equal those from the native folder;
- what cannot be converted is refused with a CheckpointError naming it, and no file of the folder is executed.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError
from tests._helpers import internvl_chat_reference as ref
from tests._helpers.tolerances import assert_close_scaled

pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

REL = 1e-5  # float32, the same weights through two implementations of the same arithmetic
QUESTIONS = ["How many circles are there?", "What colour is the square?"]
RESPONSES = ["I count the round shapes.\n\nThere are two.\n\nSo 2.", "The square is red.\n\n<answer>red</answer>"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    native = ref.write_native(tmp_path_factory.mktemp("native"), seed=3)
    official = ref.write_official(native, tmp_path_factory.mktemp("official"))
    return native, official


@pytest.fixture(scope="module")
def converted(folders):
    from mmreward.backbones.internvl_chat import load_internvl_chat

    _, official = folders
    raw = json.loads((official / "config.json").read_text())
    return load_internvl_chat(official, raw, image_token_id=7)


def test_language_model_logits_equal_the_original_internlm2(folders, converted):
    _, official = folders
    sd = ref.read_official(official)
    llm = json.loads((official / "config.json").read_text())["llm_config"]
    gen = torch.Generator().manual_seed(0)
    lm = converted.model.language_model
    # 40 tokens: plain rope; 90 > max_position_embeddings 64: dynamic NTK stretches the base (one fresh call each)
    for length in (40, 90):
        embeds = torch.randn(2, length, llm["hidden_size"], generator=gen)
        with torch.inference_mode():
            got = converted.lm_head(lm(inputs_embeds=embeds).last_hidden_state)
        expected = ref.internlm2_logits(sd, llm, embeds)
        assert float(expected.std()) > 1.0  # random weights give logits of visible spread
        assert_close_scaled(got, expected, rel=REL, msg=lambda m, n=length: f"{n} tokens: {m}")


@pytest.mark.parametrize("tower", ["visualprm-8b", "internvit-6b-style"])
def test_image_features_equal_the_original_internvit(tower, tmp_path, folders, converted):
    from mmreward.backbones.internvl_chat import load_internvl_chat

    if tower == "visualprm-8b":  # InternViT-300M: layer norm, qkv bias, no q/k norm (VisualPRM-8B's config)
        official, model = folders[1], converted
    else:  # RMSNorm and q/k normalisation, mapped to native use_qk_norm / norm_type 'rms_norm'
        native = ref.write_native(tmp_path / "n", seed=4, qk_norm=True, norm_type="rms_norm")
        official = ref.write_official(native, tmp_path / "o", qk_norm=True, norm_type="rms_norm")
        model = load_internvl_chat(official, json.loads((official / "config.json").read_text()), image_token_id=7)
    cfg = json.loads((official / "config.json").read_text())
    pixels = torch.randn(3, 3, ref.SIZES["image"], ref.SIZES["image"], generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = model.model.get_image_features(pixel_values=pixels).pooler_output
    expected = ref.internvit_features(ref.read_official(official), cfg, pixels)
    assert got.shape == expected.shape == (3, 4, ref.SIZES["hidden"])
    assert_close_scaled(got, expected, rel=REL)


def _images(tmp_path):
    rng = np.random.default_rng(5)
    paths = []
    for i, shape in enumerate([(60, 90, 3), (56, 56, 3)]):
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(tmp_path / f"{i}.png")
        paths.append(str(tmp_path / f"{i}.png"))
    return paths


def test_step_scores_from_the_official_layout_equal_the_native_layout(folders, tmp_path, capsys):
    native, official = folders
    paths = _images(tmp_path)
    from_native = mmreward.load("visual-prm", checkpoint=str(native), max_num=2)
    from_official = mmreward.load("visual-prm", checkpoint=str(official), max_num=2)
    expected = torch.cat(from_native.step_scores(QUESTIONS, paths, RESPONSES))
    got = torch.cat(from_official.step_scores(QUESTIONS, paths, RESPONSES))
    assert got.shape == expected.shape == (5,)
    assert float(expected.max() - expected.min()) > 0.05  # the steps' scores differ: the comparison has teeth
    max_abs = float((got - expected).abs().max())
    with capsys.disabled():
        print(f"\nvisual-prm official vs native layout: max abs step-score diff {max_abs:.3g}")
    assert_close_scaled(got, expected, rel=REL)
    assert not (official / "REMOTE_CODE_RAN").exists()  # none of the folder's .py files was imported


def _copy(official, tmp_path):
    return shutil.copytree(official, tmp_path / "copy")


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        section, _, field = key.rpartition("__")
        (cfg[section] if section else cfg)[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change, match", [
    ({"ps_version": "v1"}, "ps_version 'v1'"),
    ({"select_layer": -2}, "select_layer -2"),
    ({"force_image_size": 448}, "force_image_size 448"),
    ({"llm_config__architectures": ["Qwen2ForCausalLM"]}, "Qwen2ForCausalLM"),
    ({"llm_config__rope_scaling": {"type": "yarn", "factor": 2.0}}, "rope_scaling"),
    ({"vision_config__qk_normalization": True, "vision_config__layer_norm_eps": 1e-5}, "eps"),
    ({"template": "internlm2-chat"}, "template"),
])
def test_what_does_not_convert_is_refused(folders, tmp_path, change, match):
    folder = _copy(folders[1], tmp_path)
    _edit_config(folder, **change)
    with pytest.raises(CheckpointError, match=match):
        mmreward.load("visual-prm", checkpoint=str(folder))


def test_unmapped_missing_and_tokenizer_problems_are_named(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(folders[1], tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / sorted(set(index["weight_map"].values()))[0]
    tensors = load_file(str(shard))
    save_file({**tensors, "vision_model.encoder.layers.0.attn.extra.weight": torch.ones(2)}, str(shard))
    with pytest.raises(CheckpointError, match=r"attn\.extra\.weight"):
        mmreward.load("visual-prm", checkpoint=str(folder))
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(shard))
    with pytest.raises(CheckpointError, match="missing keys"):
        mmreward.load("visual-prm", checkpoint=str(folder))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        mmreward.load("visual-prm", checkpoint=str(folder))
    assert not (folder / "REMOTE_CODE_RAN").exists()
