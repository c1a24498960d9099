"""A run on a model with a short token limit prints one truncation line, not one per prompt (issue 28 item 12)."""

from __future__ import annotations

import pytest

from diffusion_rl.config import from_dict
from diffusion_rl.trainer import Trainer


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    from mmreward.testing.tiny_models import save_tiny_pipeline

    return str(save_tiny_pipeline("sd3", tmp_path_factory.mktemp("trunc") / "sd3"))


def test_truncations_are_reported_once_per_run(sd3, tmp_path, capfd):
    prompts = [f"a red circle above a blue square number {i} with many more words" for i in range(5)]
    cfg = from_dict({
        "model": {"pretrained": sd3, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 4},
        "sample": {"num_steps": 2, "kernel": "flow_sde", "noise_level": 0.7, "prompts_per_iteration": 2,
                   "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "probe": "off"},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": prompts},
        "log": {"output_dir": str(tmp_path / "run"), "progress": False},
    })
    trainer = Trainer(cfg)
    capfd.readouterr()
    trainer.embeds_for(prompts[:3])
    trainer.embeds_for(prompts)
    err = capfd.readouterr().err
    assert trainer._truncation.count >= 5  # every prompt was truncated (T5 at 4 tokens, CLIP too)
    assert err.count("was truncated") == 1 and err.count("note: prompts are truncated") == 1, err

    # without the notice, diffusers prints one warning per prompt: what the run used to show
    capfd.readouterr()
    for p in prompts[:3]:
        trainer.adapter.encode([p + " again"])
    assert capfd.readouterr().err.count("was truncated") >= 3
