"""Wan (video) rollouts on a tiny config-built WanPipeline: the ODE path is the pipeline's own Euler sampling,
SDE log-probs are Gaussian densities over (B, C, T', H', W') latents, decoding gives (B, T, 3, H, W) videos."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import DEFAULT_LORA_TARGETS, make_adapter, pipeline_family
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

H = W = 32
FRAMES = 9  # (9 - 1) / 4 + 1 = 3 latent frames
MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def wan_pipe(tmp_path_factory):
    from mmreward.testing.tiny_models import frozen_tiny_pipeline

    return frozen_tiny_pipeline("wan", tmp_path_factory.mktemp("wan_tok"))


@pytest.fixture()
def euler_pipe(wan_pipe):
    """The same pipeline sampling with flow-matching Euler at the UniPC scheduler's flow_shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    original = wan_pipe.scheduler
    wan_pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=original.config.flow_shift)
    yield wan_pipe
    wan_pipe.scheduler = original


def test_wan_is_its_own_family_with_video_latents(wan_pipe):
    assert pipeline_family(wan_pipe) == "wan"
    adapter = make_adapter(wan_pipe, H, W, MSL, num_frames=FRAMES)
    assert adapter.latent_shape() == (16, 3, H // 8, W // 8)
    # LoRA targets name modules that exist in both attention blocks of every Wan block
    names = {n for n, _ in wan_pipe.transformer.named_modules()}
    for block in range(2):
        for attn in ("attn1", "attn2"):
            for target in DEFAULT_LORA_TARGETS["wan"]:
                assert f"blocks.{block}.{attn}.{target}" in names


def test_rollout_schedule_uses_the_unipc_flow_shift(wan_pipe, euler_pipe):
    # the official UniPC scheduler is replaced by Euler sigmas with the same shift 3: shift(s) = 3 s / (1 + 2 s)
    # applied to N points from 1 to the smallest training sigma, itself shift(1 / 1000) (diffusers' Euler)
    unipc = make_adapter(wan_pipe, H, W, MSL, num_frames=FRAMES)
    sched = unipc.schedule(4)
    s = torch.linspace(1.0, 3 * 0.001 / (1 + 2 * 0.001), 4, dtype=torch.float64)
    shifted = 3 * s / (1 + 2 * s)
    assert_close_scaled(sched.a, shifted, rel=1e-5)
    assert_close_scaled(sched.b, torch.cat([shifted[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-5)


# Flow-SDE on Wan: the adapter conformance suite (behaviour 2); DanceGRPO's kernel over 5-D latents is checked here
@pytest.mark.parametrize("kernel", [Kernel("dance_sde", 0.3)])
def test_sde_log_probs_are_gaussian_densities_over_video_latents(wan_pipe, kernel):
    adapter = make_adapter(wan_pipe, H, W, MSL, num_frames=FRAMES)
    emb = adapter.encode(PROMPTS)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=3, guidance_scale=4.0, kernel=kernel, sde_steps=[0, 1],
                   store_means=True, decode=False)
    for j in range(2):
        sigma, sigma_next = float(traj.schedule.a[j]), float(traj.schedule.b[j])
        if kernel.name == "flow_sde":  # Flow-GRPO: a sqrt(sigma / (1 - sigma)) sqrt(-dt), sigma_1 at sigma = 1
            denom = sigma_next if sigma >= 1 else sigma
            std = 0.7 * math.sqrt(sigma / (1 - denom)) * math.sqrt(sigma - sigma_next)
        else:  # DanceGRPO: eta sqrt(sigma - sigma_next)
            std = 0.3 * math.sqrt(sigma - sigma_next)
        density = torch.distributions.Normal(traj.means[:, j].double(), std).log_prob(traj.latents[:, j + 1].double())
        expected = density.mean(dim=(1, 2, 3, 4))  # the mean-over-elements convention of the image families
        assert_close_scaled(traj.log_probs[:, j].double(), expected, rel=1e-5)
        # the training path recomputes the same log-prob with the same code
        res = step_log_prob(adapter, adapter.denoiser, traj.latents[:, j], traj.latents[:, j + 1],
                            torch.full((2,), j), traj.schedule, emb, 4.0, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 2] == 0).all()


@pytest.fixture(scope="module")
def pipe_dirs(tmp_path_factory):
    from mmreward.testing.tiny_models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("video_train_pipes")
    return {k: str(save_tiny_pipeline(k, root / k)) for k in ("wan", "sd3")}


def _run_cfg(pipe_dir: str, rewards: dict, out, num_frames: int | None = FRAMES) -> dict:
    return {
        "model": {"pretrained": pipe_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": MSL, "num_frames": num_frames},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 0.5, "kl_beta": 0.01},
        "advantage": {"min_count": 2},
        "reward": {"rewards": rewards},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


def test_rewards_of_the_wrong_modality_are_config_errors(pipe_dirs, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    with pytest.raises(ConfigError, match=r"\['shapes-video-eval'\] cannot score the images a sd3 pipeline"):
        Trainer(from_dict(_run_cfg(pipe_dirs["sd3"], {"shapes-video-eval": 1.0}, tmp_path / "a", num_frames=None)))
    with pytest.raises(ConfigError, match=r"\['shapes-eval'\] cannot score the videos a wan pipeline.*video-frames"):
        Trainer(from_dict(_run_cfg(pipe_dirs["wan"], {"shapes-eval": 1.0}, tmp_path / "b")))


def test_model_num_frames_is_checked_against_the_pipeline(pipe_dirs, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.config_check import config_keys
    from diffusion_rl.trainer import Trainer

    with pytest.raises(ConfigError, match="model.num_frames must be > 0, got 0"):
        from_dict(_run_cfg(pipe_dirs["wan"], {"mock": 1.0}, tmp_path / "z", num_frames=0))
    with pytest.raises(ConfigError, match="model.num_frames counts something, so it must be a whole number"):
        from_dict(_run_cfg(pipe_dirs["wan"], {"mock": 1.0}, tmp_path / "f", num_frames=8.5))
    # the family's temporal rule, before any sampling: Wan's VAE compresses time by 4
    with pytest.raises(ConfigError, match=r"num_frames=10 cannot be made by WanPipeline.*\(e.g. 9 or 13\)"):
        Trainer(from_dict(_run_cfg(pipe_dirs["wan"], {"mock": 1.0}, tmp_path / "w", num_frames=10)))
    with pytest.raises(ConfigError, match="num_frames=9 was given for StableDiffusion3Pipeline, which makes images"):
        Trainer(from_dict(_run_cfg(pipe_dirs["sd3"], {"mock": 1.0}, tmp_path / "s")))
    key = next(k for k in config_keys() if k.key == "model.num_frames")
    assert key.default == "None" and "temporal factor" in key.help


# slow (~50 s on 2 busy cores, mostly the two processes' start-up): the default suite checks 2 processes == 1
# process on SD3 (tests/diffusion_rl/test_diffusion_rl_train.py::test_two_process_data_parallel_equals_one_process:
# the same gathered rewards, global advantages, gradient all-reduce and weights), and Wan's rollouts, video
# rewards and training path in one process (this file, test_adapter_conformance.py::TestWan); what this adds is
# the video reward on clips gathered across processes. Two iterations sample from the updated LoRA.
@pytest.mark.slow
@pytest.mark.parametrize("iterations", [1, 2])
def test_two_process_wan_run_equals_one_process_run(pipe_dirs, tmp_path, iterations):
    """accelerate on CPU with 2 gloo processes and the same global batch (4 prompts x 2 samples, a video reward
    on the gathered clips) gives the same rewards, gradients and LoRA weights as one process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    cfg = _run_cfg(pipe_dirs["wan"], {"temporal-consistency": 1.0}, tmp_path / "dp2", num_frames=5)
    cfg["reward"]["options"] = {"temporal-consistency": {"backbone": "pixels"}}
    cfg["sample"].update(prompts_per_iteration=4, batch_size=4)
    # Adam's eps at the size of the gradients: its step then follows the gradient instead of sign(g), which on
    # coordinates with |g| near the default 1e-8 turned float-summation noise into 1.3% of the learning rate
    cfg["train"].update(iterations=iterations, timestep_selection="random", adam_eps=1e-3)
    cfg["advantage"]["std_scope"] = "global"
    cfg["prompts"]["train"] = [*PROMPTS, "a green triangle moving right", "a yellow star moving down"]
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launcher = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run([str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29541",
                           "-m", "diffusion_rl", "train", "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg["log"]["output_dir"] = str(tmp_path / "dp1")
    one = Trainer(from_dict(cfg))
    one.fit()
    two = read_checkpoint(tmp_path / "dp2" / "checkpoints" / f"iter_{iterations:06d}")
    assert len(two["history"]) == len(one.history) == iterations
    for h2, h1 in zip(two["history"], one.history):
        # the same clips and rewards (counter-based noise, gathered in canonical order) ...
        assert h2["reward/temporal-consistency"] == pytest.approx(h1["reward/temporal-consistency"], rel=1e-6)
        # ... the same gradient, its global norm measured before the optimiser step (DDP's all-reduce mean of
        # the two halves' gradients vs one process's mean over all samples: float-summation-order noise)
        assert h2["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-4)
    # ... and the same Adam steps, to 1% of the learning rate (Adam amplifies float noise on coordinates
    # whose gradient is near its eps); the LoRA moved by far more than that
    names = {id(p): n for n, p in one.policy.unwrapped.named_parameters()}
    lr = cfg["train"]["learning_rate"]
    moved = 0.0
    for p in one.trainable:
        other = two["params"][names[id(p)]]
        torch.testing.assert_close(p.detach().cpu(), other, rtol=0, atol=1e-2 * lr)
        if "lora_B" in names[id(p)]:  # B starts at zero: its size is how far training went
            moved = max(moved, float(p.detach().abs().max()))
    assert moved > 0.5 * lr
