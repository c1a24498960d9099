"""EditScore LoRA files saved with transformers < 4.52 key names load, strictly, and score as the current layout.

Before 4.52 a Qwen2.5-VL ForConditionalGeneration held the decoder at `model.layers.*` and the vision tower at
`visual.*`; since 4.52 they are `model.language_model.layers.*` and `model.visual.*` (transformers'
Qwen2_5_VLForConditionalGeneration._checkpoint_conversion_mapping). EditScore/EditScore-7B was trained before
that, so a PEFT adapter file in the old layout is what users download. The old-layout file here is written by
renaming the keys of a PEFT-saved adapter with those two rules.
"""

from __future__ import annotations

import json

import pytest
import torch

import mmreward
from mmreward.errors import CheckpointError

pytest.importorskip("transformers")
pytest.importorskip("peft")


def _old_layout(key: str) -> str:
    """The pre-4.52 name of a current-layout PEFT key."""
    for new, old in (("base_model.model.model.language_model.", "base_model.model.model."),
                     ("base_model.model.model.visual.", "base_model.model.visual.")):
        if key.startswith(new):
            return old + key[len(new):]
    return key


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    root = tmp_path_factory.mktemp("editscore_lora")
    base_dir = root / "qwen25vl"
    build_tiny_qwen_vl(base_dir, variant="qwen2_5_vl", seed=1)
    base = AutoModelForImageTextToText.from_pretrained(base_dir).eval()
    torch.manual_seed(7)
    # decoder projections and the vision tower's qkv: both renamed parts of the layout are covered
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"],
                                                 init_lora_weights=False))
    peft_model.save_pretrained(str(root / "new"))
    new = load_file(str(root / "new" / "adapter_model.safetensors"))
    old = {_old_layout(k): v for k, v in new.items()}
    assert any(k.startswith("base_model.model.visual.") for k in old)
    assert any(k.startswith("base_model.model.model.layers.") for k in old)
    assert not any(k.startswith(("base_model.model.model.language_model.", "base_model.model.model.visual."))
                   for k in old)
    (root / "old").mkdir()
    save_file(old, str(root / "old" / "adapter_model.safetensors"))
    (root / "old" / "adapter_config.json").write_text((root / "new" / "adapter_config.json").read_text())
    return base_dir, root


def _load(base_dir, adapter):
    return mmreward.load("editscore", checkpoint=str(adapter), base_model=str(base_dir), temperature=0.0,
                         max_pixels=56 * 56, min_pixels=28 * 28, max_new_tokens=4)


def test_old_and_new_key_layouts_merge_the_same_weights_and_score_the_same(adapters):
    from transformers import AutoModelForImageTextToText

    base_dir, root = adapters
    judge_new, judge_old = _load(base_dir, root / "new"), _load(base_dir, root / "old")
    fresh = AutoModelForImageTextToText.from_pretrained(base_dir).eval().state_dict()
    new_sd, old_sd = judge_new.vlm.state_dict(), judge_old.vlm.state_dict()
    assert new_sd.keys() == old_sd.keys()
    changed = 0
    for k in new_sd:
        assert torch.equal(new_sd[k], old_sd[k]), k
        changed += int(not torch.equal(new_sd[k], fresh[k]))
    assert changed >= 3  # the LoRA was merged into decoder and vision weights, not skipped
    assert any("visual" in k and not torch.equal(new_sd[k], fresh[k]) for k in new_sd)
    torch.manual_seed(0)
    edited, source = torch.rand(2, 3, 56, 56), torch.rand(2, 3, 56, 56)
    meta = [{"source_image": s} for s in source]
    out_new = judge_new.score(["make it blue", "add a hat"], edited, metadata=meta)
    out_old = judge_old.score(["make it blue", "add a hat"], edited, metadata=meta)
    assert out_new.rationales == out_old.rationales
    torch.testing.assert_close(out_new.scores, out_old.scores, rtol=0, atol=0, equal_nan=True)


def test_an_old_layout_key_with_no_module_is_an_error(adapters, tmp_path):
    from safetensors.torch import load_file, save_file

    base_dir, root = adapters
    sd = load_file(str(root / "old" / "adapter_model.safetensors"))
    name = next(k for k in sd if k.startswith("base_model.model.visual.") and k.endswith("lora_A.weight"))
    sd[name.replace("blocks.0.", "blocks.99.")] = sd[name].clone()  # a block the tiny model does not have
    (tmp_path / "bad").mkdir()
    save_file(sd, str(tmp_path / "bad" / "adapter_model.safetensors"))
    config = json.loads((root / "old" / "adapter_config.json").read_text())
    (tmp_path / "bad" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not match the base model"):
        _load(base_dir, tmp_path / "bad")


def test_a_key_in_both_layouts_is_an_error(adapters, tmp_path):
    from safetensors.torch import load_file, save_file

    base_dir, root = adapters
    sd = load_file(str(root / "new" / "adapter_model.safetensors"))
    name = next(k for k in sd if ".language_model." in k)
    sd[_old_layout(name)] = sd[name].clone()
    (tmp_path / "both").mkdir()
    save_file(sd, str(tmp_path / "both" / "adapter_model.safetensors"))
    (tmp_path / "both" / "adapter_config.json").write_text((root / "new" / "adapter_config.json").read_text())
    with pytest.raises(CheckpointError, match="both the pre-4.52 and the current"):
        _load(base_dir, tmp_path / "both")
