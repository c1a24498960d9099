"""Run by `torchrun --nproc_per_node 2` from tests/diffusion_rl/test_context_parallel.py: a rollout of the tiny Wan pipeline with
`model.context_parallel: {ulysses_degree: 2}` built through the run-config path (`run_pipeline` +
`adapter_for_config`), on CPU with gloo. The main process saves the trajectory to OUT/cp.safetensors; each process
also checks that its first transformer block saw half of the tokens (the split really happened) and that ring
attention is a typed error on CPU.

    python context_parallel_run.py PIPELINE_DIR OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from diffusion_rl.config import ModelConfig
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import adapter_for_config, run_pipeline
from diffusion_rl.rollout import rollout
from mmreward.errors import ConfigError

PROMPTS = ["a red circle moving left", "a blue square moving up"]


def settings(pipe_dir: str, **cp) -> ModelConfig:
    return ModelConfig(pretrained=pipe_dir, height=32, width=32, num_frames=9, max_sequence_length=16,
                       context_parallel=cp or None)


@torch.no_grad()
def sample(adapter) -> object:
    return rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 1], num_steps=3, guidance_scale=2.0,
                   kernel=Kernel("flow_sde", 0.7), sde_steps=[0, 1], seed=5)


def main(pipe_dir: str, out: str) -> None:
    dist.init_process_group("gloo")
    cfg = settings(pipe_dir, ulysses_degree=2)
    adapter = adapter_for_config(run_pipeline(cfg, "cpu"), cfg)
    tokens = []
    adapter.denoiser.blocks[0].register_forward_hook(lambda m, a, o: tokens.append(o.shape[1]))
    traj = sample(adapter)
    full = 3 * (32 // 16) * (32 // 16)  # latent frames x (H/8/2) x (W/8/2) patches
    assert set(tokens) == {full // 2}, tokens
    try:
        ring = settings(pipe_dir, ring_degree=2)
        adapter_for_config(run_pipeline(ring, "cpu"), ring)
        raise AssertionError("ring attention on CPU was not refused")
    except ConfigError as err:
        assert "needs GPUs" in str(err), err
    if dist.get_rank() == 0:
        save_file({"latents": traj.latents.contiguous(), "log_probs": traj.log_probs.contiguous(),
                   "images": traj.images.contiguous()}, str(Path(out) / "cp.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
