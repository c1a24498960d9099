"""configs/pref_grpo_flux_unifiedreward_think.yaml has Pref-GRPO's values, transcribed from
CodeGoat24/Pref-GRPO@3e787f6dd5a3051b40d61f07e9578468ac26130a (fastvideo/train_flux.py, scripts/_common_finetune.sh,
scripts/lora/lora_ur_think_prefgrpo_flux.sh, fastvideo/rewards/{unifiedreward_think,templates}.py,
vllm_utils/{vllm_server_UnifiedReward_Think.sh,vllm_request.py}).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from diffusion_rl.config import load_config
from mmreward.errors import ConfigError

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "pref_grpo_flux_unifiedreward_think.yaml"

# train_flux.py default_target_modules (used when --lora_target_modules is not passed, as in the script)
PREF_GRPO_LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj",
                          "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2",
                          "ff_context.net.0.proj", "ff_context.net.2"]
# sha256 of templates.py get_unifiedreward_think_image_template() at 3e787f6, computed from the original file
THINK_IMAGE_TEMPLATE_SHA256 = "a8a0d80818246406b783d5cca630336c5fdf1264fef13f09d09bd94d61a139d5"


@pytest.fixture(scope="module")
def cfg():
    return load_config(RECIPE)


def test_recipe_cites_the_commit():
    assert "Pref-GRPO@3e787f6dd5a3051b40d61f07e9578468ac26130a" in RECIPE.read_text()


def test_resolution_and_lora_are_pref_grpo(cfg):
    assert (cfg.model.height, cfg.model.width) == (720, 720)  # argparse --h / --w default 720
    assert cfg.model.lora and (cfg.model.lora_rank, cfg.model.lora_alpha) == (64, 128)  # --lora_rank 64 --lora_alpha 128
    assert cfg.model.lora_targets == PREF_GRPO_LORA_TARGETS
    assert cfg.model.lora_init == "default"  # LoraConfig(init_lora_weights=True)


def test_judge_template_and_pair_order_are_pref_grpo(cfg):
    opts = cfg.reward.options["unifiedreward-think"]
    assert opts["checkpoint"] == "CodeGoat24/UnifiedReward-Think-qwen3vl-8b"  # vllm serve ... in the server script
    assert opts["max_new_tokens"] == 4096  # vllm_request.py payload max_tokens
    assert hashlib.sha256(opts["pairwise_template"].encode()).hexdigest() == THINK_IMAGE_TEMPLATE_SHA256
    assert cfg.reward.both_orders is False  # itertools.combinations: each pair once
    assert cfg.reward.win_mode == "hard"  # 1 / 0 / 0.5 per verdict


def test_lora_init_default_is_peft_default_and_validated():
    import torch
    from peft import LoraConfig, get_peft_model

    from diffusion_rl.config import ModelConfig

    assert ModelConfig(pretrained="x").lora_init == "gaussian"
    with pytest.raises(ConfigError, match="lora_init"):
        ModelConfig(pretrained="x", lora_init="kaiming")
    # what lora_init='default' asks PEFT for: Kaiming-uniform A (bounded by 1/sqrt(in)), zero B
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64))
    peft = get_peft_model(net, LoraConfig(r=8, lora_alpha=8, init_lora_weights=True, target_modules=["0"]))
    a = peft.base_model.model[0].lora_A["default"].weight
    assert float(a.abs().max()) <= 1 / 64 ** 0.5 + 1e-6 and float(a.std()) > 0
