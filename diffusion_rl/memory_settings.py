"""Memory knobs of a run, resolved per pipeline: what stays on the accelerator, and for how long.

A video step holds frames x pixels where an image step holds pixels, so three things that do not matter for
images decide whether a video run fits (issue 17). Each is a config key whose default `None` means "auto":
on for video pipelines, and today's behaviour for image pipelines, bit for bit.

- `sample.decode_chunk_size`: samples the VAE decodes at once (`pipelines.decode_chunked`); auto = one clip for
  video, the whole batch for images. Chunked decoding equals whole-batch decoding (tested).
- `model.gradient_checkpointing`: recompute the denoiser's activations in backward instead of keeping them;
  auto = on for video. Costs about one extra forward per backward; the gradients are unchanged (tested).
- `sample.offload_trajectory`: each rollout's per-step latents, log-probs, means and decoded samples are moved
  to CPU memory as they are made, so the accelerator holds one state x_t (and one decode chunk) at a time; the
  update moves back only the two latents each trained step needs (`step_pair`). Auto = on for video. The
  update is bit-identical (tested): moving a tensor between devices does not change its values.

`benchmarks/rl_step.py --family wan` measures the peak memory of a step against frames and resolution.
"""

from __future__ import annotations

from typing import Any

import torch

from diffusion_rl.pipelines import PipelineAdapter


def _auto_for_video(setting: bool | None, adapter: PipelineAdapter) -> bool:
    return adapter.modality == "video" if setting is None else bool(setting)


def gradient_checkpointing(setting: bool | None, adapter: PipelineAdapter) -> bool:
    """`model.gradient_checkpointing` resolved: None (auto) is on for video pipelines, off for images."""
    return _auto_for_video(setting, adapter)


def offload_trajectory(setting: bool | None, adapter: PipelineAdapter) -> bool:
    """`sample.offload_trajectory` resolved: None (auto) is on for video pipelines, off for images."""
    return _auto_for_video(setting, adapter)


def rollout_kwargs(sample_cfg: Any, adapter: PipelineAdapter) -> dict[str, Any]:
    """The memory arguments of `rollout` from a run's `sample` section (training rollouts and evaluation)."""
    return {"decode_chunk_size": sample_cfg.decode_chunk_size,
            "offload": offload_trajectory(sample_cfg.offload_trajectory, adapter)}


def step_pair(latents: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, x_next) of step `steps[i]` of trajectory `rows[i]`, on `device`: only these two states per trained
    sample travel back to the accelerator when the trajectory is stored on CPU (`offload_trajectory`)."""
    rows, steps = rows.to(latents.device), steps.to(latents.device)
    return latents[rows, steps].to(device), latents[rows, steps + 1].to(device)
