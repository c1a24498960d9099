"""`final/` loads in diffusers and is the trained model: a LoRA run's folder through `pipe.load_lora_weights`
(alpha and targets restored from the adapter metadata), a full fine-tune's through
`DiffusionPipeline.from_pretrained`, sampled with the pipelines' own `__call__` (tiny SD, SDXL, SD3, FLUX)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from diffusion_rl.config import from_dict
from diffusion_rl.export import LORA_WEIGHT_NAME, atomic_folder
from diffusion_rl.pipelines import load_pipeline
from diffusion_rl.trainer import Trainer
from mmreward.errors import CheckpointError
from tests._helpers.tolerances import assert_close_scaled

KINDS = ["sd", "sdxl", "sd3", "flux"]
RANK, ALPHA = 4, 16  # alpha != rank: an export that drops alpha loads with a 4x smaller update
TARGETS = ["to_q", "to_v", "ff.net.2"]  # not the default list: the metadata must carry it
PROMPTS = ["a red circle", "a blue square"]
# The sampled images are in [0, 1]; the exported model runs the same ops on the same weights as the trained
# one, so they agree bit for bit (measured max |diff| = 0.0 for every family). 1e-6 of that range leaves room
# for a reordered float sum, and is 1e3-1e4 times smaller than what one training step moves the images
# (0.02-0.1) and than what an alpha-less load changes.
REL = 1e-6
MOVED = 1e-3  # the least max |diff| that counts as "a different model" on a [0, 1] image


@pytest.fixture(scope="module")
def pipes(tiny_pipeline_dir) -> dict[str, str]:
    """The session's tiny pipelines pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return {k: str(tiny_pipeline_dir(k)) for k in KINDS}


def _flow(kind: str) -> bool:
    return kind in ("sd3", "flux")


def _cfg(pipe_dir: str, kind: str, out: Path, **model) -> dict:
    flow = _flow(kind)
    return {
        "model": {"pretrained": pipe_dir, "height": 16, "width": 16, "max_sequence_length": 8 if flow else None,
                  **model},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde" if flow else "ddim",
                   "noise_level": 0.7 if flow else 1.0, "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "timestep_fraction": 0.5},
        "prompts": {"train": PROMPTS},
        "reward": {"rewards": {"mock": 1.0}},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@torch.no_grad()
def _sample(pipe, kind: str) -> torch.Tensor:
    """The pipeline's own sampler with fixed noise (a seeded generator), as a user would call it."""
    kw = {"max_sequence_length": 8} if _flow(kind) else {}
    return pipe(PROMPTS, num_inference_steps=2, guidance_scale=2.0, height=16, width=16, output_type="pt",
                generator=torch.Generator().manual_seed(7), **kw).images


def _differs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# the default suite: one UNet family (sd, "unet.*" keys) and one transformer family (flux, "transformer.*"); the
# export code (metadata, targets, alpha) is the same for all. Every family's export reloading through its own
# load_lora_weights to the trained policy (rank 4, alpha 16, so a dropped alpha fails) is the adapter conformance
# suite's behaviour 3 (test_adapter_conformance.py), so SDXL and SD3 here are slow, for the suite's time budget
@pytest.mark.parametrize("kind", [k if k in ("sd", "flux") else pytest.param(k, marks=pytest.mark.slow)
                                  for k in KINDS])
def test_lora_export_loads_with_load_lora_weights_and_reproduces_the_trained_model(pipes, tmp_path, kind):
    from safetensors import safe_open
    from safetensors.torch import load_file

    trainer = Trainer(from_dict(_cfg(pipes[kind], kind, tmp_path, lora_rank=RANK, lora_alpha=ALPHA,
                                     lora_targets=TARGETS)))
    trainer.fit()  # one GRPO iteration, then final/
    final = tmp_path / "final"
    trained = _sample(trainer.adapter.pipeline, kind)
    base_out = _sample(load_pipeline(pipes[kind]), kind)
    assert _differs(trained, base_out) > MOVED, "training did not change the samples; the round trip proves nothing"

    loaded_pipe = load_pipeline(pipes[kind])
    loaded_pipe.load_lora_weights(str(final))
    assert_close_scaled(_sample(loaded_pipe, kind), trained, rel=REL, scale=1.0)

    # the adapter config sits in the safetensors header, where load_lora_weights reads it
    attr = trainer.adapter.denoiser_attr
    with safe_open(str(final / LORA_WEIGHT_NAME), "pt") as f:
        meta = json.loads(f.metadata()["lora_adapter_metadata"])
    assert meta[f"{attr}.r"] == RANK and meta[f"{attr}.lora_alpha"] == ALPHA
    assert set(meta[f"{attr}.target_modules"]) == set(TARGETS)

    # the same weights without the metadata load with alpha = r, the bug this export fixes: that must show
    alphaless = load_pipeline(pipes[kind])
    alphaless.load_lora_weights(load_file(str(final / LORA_WEIGHT_NAME)))
    assert _differs(_sample(alphaless, kind), trained) > MOVED


def test_full_finetune_exports_a_pipeline_folder_with_the_ema_weights(pipes, tmp_path):
    from diffusers import DiffusionPipeline, StableDiffusion3Pipeline

    kind = "sd3"
    cfg = _cfg(pipes[kind], kind, tmp_path, lora=False)
    cfg["train"].update(learning_rate=1e-3, ema=True, ema_update_every=1)
    trainer = Trainer(from_dict(cfg))
    trainer.fit()
    pipe = trainer.adapter.pipeline
    live = _sample(pipe, kind)
    with trainer.policy.averaged():
        averaged = _sample(pipe, kind)
    # after one update the EMA (decay 0.1 at its first step) is neither the base nor the live weights
    assert _differs(live, averaged) > MOVED
    assert _differs(averaged, _sample(load_pipeline(pipes[kind]), kind)) > MOVED

    final = tmp_path / "final"
    assert (final / "model_index.json").is_file()
    assert not list(final.rglob("*.bin")), "weights must be safetensors (nothing to unpickle)"
    loaded = DiffusionPipeline.from_pretrained(str(final))
    assert isinstance(loaded, StableDiffusion3Pipeline)
    loaded.set_progress_bar_config(disable=True)
    assert_close_scaled(_sample(loaded, kind), averaged, rel=REL, scale=1.0)
    # exporting put the pipeline back as it was: training and sampling go on with the live weights
    assert torch.equal(_sample(pipe, kind), live)


def test_atomic_folder_replaces_only_on_success(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "old.txt").write_text("previous export")
    with pytest.raises(RuntimeError, match="killed"), atomic_folder(final) as tmp:
        (tmp / "half.txt").write_text("partial")
        raise RuntimeError("killed mid-export")
    assert [p.name for p in final.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"], "the temporary folder was left behind"

    with atomic_folder(final) as tmp:
        (tmp / "new.txt").write_text("complete")
    assert [p.name for p in final.iterdir()] == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]

    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a folder"), atomic_folder(tmp_path / "file"):
        pass
