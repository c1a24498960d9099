"""FSDP2 wraps each transformer block of the family on its own: the adapter's `block_classes` reach accelerate's
TRANSFORMER_BASED_WRAP plugin (`diffusion_rl.accelerator.name_fsdp_blocks`), a launch config's own class names win,
and a 2-process gloo run on a video family (Wan) shards block by block (slow; the SD3 run in
tests/diffusion_rl/test_diffusion_rl_accelerate.py checks the same in the default suite). Each adapter's class names are checked
against its tiny transformer by the conformance suite (test_fsdp_block_classes_name_modules_of_the_transformer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from diffusion_rl.accelerator import name_fsdp_blocks

REPO = Path(__file__).resolve().parents[2]


def _acc(plugin) -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))


def test_block_classes_fill_the_transformer_based_wrap_policy_unless_the_launch_config_names_them():
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from diffusers import LTX2VideoTransformer3DModel

    from diffusion_rl.adapters.ltx2 import LTX2Adapter

    # LTX-2's transformer declares no _no_split_modules: accelerate alone would wrap no block
    assert getattr(LTX2VideoTransformer3DModel, "_no_split_modules", None) is None
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    assert name_fsdp_blocks(_acc(plugin), LTX2Adapter.block_classes) == ["LTX2VideoTransformerBlock"]
    assert plugin.transformer_cls_names_to_wrap == ["LTX2VideoTransformerBlock"]

    # the names resolve in a real transformer to a policy matching exactly its blocks (accelerate's own code)
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                  out_channels=4, text_dim=8, freq_dim=8, ffn_dim=16, num_layers=3, rope_max_seq_len=32)
    wan = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    name_fsdp_blocks(_acc(wan), ("WanTransformerBlock",))
    policy = fsdp2_prepare_auto_wrap_policy(wan, model)
    assert [n for n, m in model.named_modules() if policy(m)] == ["blocks.0", "blocks.1", "blocks.2"]

    # a launch config's fsdp_transformer_layer_cls_to_wrap wins; other wrap policies and non-FSDP runs: untouched
    given = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                           transformer_cls_names_to_wrap=["WanTransformerBlock"])
    assert name_fsdp_blocks(_acc(given), ("Other",)) == ["WanTransformerBlock"]
    size = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="size_based_wrap")
    assert name_fsdp_blocks(_acc(size), ("WanTransformerBlock",)) is None
    assert size.transformer_cls_names_to_wrap is None
    assert name_fsdp_blocks(_acc(None), ("WanTransformerBlock",)) is None


@pytest.mark.slow  # two processes start, load a tiny Wan and train one iteration (~30 s on 2 busy cores)
def test_two_process_fsdp_lora_run_on_wan_shards_each_transformer_block(tmp_path):
    from diffusers import WanPipeline

    from diffusion_rl.pipelines import load_pipeline
    from mmreward.testing.tiny_models import save_tiny_pipeline

    pipe_dir = save_tiny_pipeline("wan", tmp_path / "wan")
    cfg = {
        "model": {"pretrained": str(pipe_dir), "height": 32, "width": 32, "num_frames": 5, "lora_rank": 4,
                  "lora_alpha": 4, "max_sequence_length": 16},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 2},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 1.0},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": ["a red circle moving left", "a blue square moving up"]},
        "log": {"output_dir": str(tmp_path / "unused"), "eval_every": 0, "grid_every": 0, "progress": False},
    }
    path = tmp_path / "wan_fsdp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", "29553",
                           str(REPO / "tests" / "_helpers" / "fsdp_cpu_run.py"), str(path), str(tmp_path / "out"), "video"],
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    units = json.loads((tmp_path / "out" / "fsdp_lora" / "fsdp_units.json").read_text())
    n_blocks = len(load_pipeline(str(pipe_dir)).transformer.blocks)
    assert units == ["WanTransformer3DModel"] + ["WanTransformerBlock"] * n_blocks
    # the gathered LoRA loads with WanPipeline.load_lora_weights and moved the transformer
    loaded = WanPipeline.from_pretrained(str(pipe_dir))
    loaded.load_lora_weights(str(tmp_path / "out" / "fsdp_lora" / "final"))
    lora_b = [p for n, p in loaded.transformer.named_parameters() if "lora_B" in n]
    assert lora_b and max(float(p.abs().max()) for p in lora_b) > 0
    assert torch.isfinite(torch.stack([p.abs().max() for p in lora_b])).all()
