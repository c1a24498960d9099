"""Trainer: one-iteration smoke runs of every algorithm on tiny SD (UNet), SD3 and FLUX pipelines, exact
resume, the correctness probe, configs and the CLI, and 2-process data parallel == 1 process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from diffusion_rl.config import from_dict, load_config, parse_overrides
from diffusion_rl.trainer import ProbeError, Trainer
from mmreward.errors import ConfigError

PROMPTS = ["a red circle", "a blue square", "a green star"]


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    from mmreward.testing.tiny_models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("drl_train_pipes")
    return {k: str(save_tiny_pipeline(k, root / k)) for k in ("sd", "sd3", "flux")}


def _cfg(pipe_dir: str, kind: str, algo: str, out: Path, **train) -> dict:
    flow = kind != "sd"
    return {
        "model": {"pretrained": pipe_dir, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": None if kind == "sd" else 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde" if flow else "ddim",
                   "noise_level": 0.7 if flow else 1.0, "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": algo, "iterations": 1, "learning_rate": 1e-2, "probe": "error", "timestep_fraction": 0.5,
                  "kl_beta": 0.01 if algo == "grpo" else 0.0, "ratio_norm": algo == "pref_grpo", **train},
        "advantage": {"per_prompt_tracking": algo == "ddpo", "min_count": 2},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.mark.parametrize("kind", ["sd", "sd3", "flux"])
@pytest.mark.parametrize("algo", ["grpo", "pref_grpo", "ddpo"])
def test_one_iteration_smoke(pipes, tmp_path, kind, algo):
    trainer = Trainer(from_dict(_cfg(pipes[kind], kind, algo, tmp_path)))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the first ratio is 1 up to float noise
    changed = sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))
    assert changed > 0, "the update did not move any trained parameter"
    assert metrics["adv/abs_mean"] > 0


def test_exact_resume_and_outputs(pipes, tmp_path):
    straight = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", tmp_path / "a", iterations=2)))
    straight.fit()
    first = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", tmp_path / "b", iterations=1)))
    first.fit()
    ckpt = tmp_path / "b" / "checkpoints" / "iter_000001"
    resumed = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", tmp_path / "b", iterations=2, resume_from=str(ckpt))))
    assert resumed.iteration == 1
    resumed.fit()
    for a, b in zip(straight.trainable, resumed.trainable):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    out = tmp_path / "a"
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (out / "reward_curve.png").is_file()
    assert (out / "final" / "pytorch_lora_weights.safetensors").is_file()


def test_probe_stops_when_training_path_disagrees(pipes, tmp_path):
    trainer = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", tmp_path)))
    batch = trainer.collect(0)
    batch.advantages, _ = trainer.algorithm.advantages(trainer, batch)
    batch.traj.log_probs += 1e-2  # as if the rollout had used another guidance scale or dtype
    with pytest.raises(ProbeError, match="first PPO ratio is not 1"):
        trainer.update(batch)


def test_config_validation_presets_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="group_size must be at least 2 for grpo"):
        from_dict({"sample": {"group_size": 1}})
    with pytest.raises(ConfigError, match=r"unknown keys in 'train': \['lr'\]"):
        from_dict({"train": {"lr": 1.0}})
    with pytest.raises(ConfigError, match="preset 'nope' is unknown"):
        from_dict({"preset": "nope"})
    with pytest.raises(ConfigError, match="sde_window"):
        from_dict({"sample": {"num_steps": 4, "sde_window": [2, 9]}})
    cfg = from_dict({"preset": "flow_grpo", "train": {"kl_beta": 0.01}})
    # Flow-GRPO's published SD3.5 defaults, with the user's override on top
    assert (cfg.sample.num_steps, cfg.sample.noise_level, cfg.sample.group_size, cfg.sample.guidance_scale) == (10, 0.7, 24, 4.5)
    assert (cfg.train.clip_range, cfg.train.timestep_fraction, cfg.train.kl_beta, cfg.model.lora_rank) == (1e-4, 0.99, 0.01, 32)
    dance = from_dict({"preset": "dance_grpo"})
    assert (dance.sample.kernel, dance.sample.noise_level, dance.sample.group_size, dance.train.timestep_fraction) == ("dance_sde", 0.3, 12, 0.6)
    assert parse_overrides(["sample.sde_window=[0, 3]", "train.lr=1e-4"]) == {"sample": {"sde_window": [0, 3]}, "train": {"lr": 1e-4}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preset": "ddpo", "train": {"iterations": 3}}))
    cfg = load_config(path, ["train.iterations=5"])
    assert (cfg.train.iterations, cfg.sample.kernel, cfg.sample.num_steps) == (5, "ddim", 50)


def test_cli_train_and_config(pipes, tmp_path, capsys):
    from diffusion_rl.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(pipes["flux"], "flux", "grpo", tmp_path / "out")))
    assert main(["train", "--config", str(path), "prompts.eval=[a red square]", "train.iterations=1"]) == 0
    assert "eval/mock" in capsys.readouterr().out
    assert (tmp_path / "out" / "eval_grid_start.png").is_file()
    assert main(["config", "--preset", "pref_grpo"]) == 0
    assert "ratio_norm: true" in capsys.readouterr().out
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_two_process_data_parallel_equals_one_process(pipes, tmp_path):
    """accelerate on CPU with 2 gloo processes and the same global batch gives the same weights."""
    cfg = _cfg(pipes["sd3"], "sd3", "grpo", tmp_path / "dp2", iterations=1, timestep_selection="random",
               timestep_fraction=0.5)
    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["advantage"]["std_scope"] = "global"
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launcher = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run([str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "diffusion_rl", "train",
                           "--config", str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg["log"]["output_dir"] = str(tmp_path / "dp1")
    one = Trainer(from_dict(cfg))
    one.fit()
    two = torch.load(tmp_path / "dp2" / "checkpoints" / "iter_000001" / "trainer_state.pt", weights_only=False)
    # same rollouts and rewards, same gradient (its global norm is measured before the optimiser step) ...
    assert two["history"][0]["reward/mock"] == pytest.approx(one.history[0]["reward/mock"], rel=1e-6, abs=1e-6)
    assert two["history"][0]["train/grad_norm"] == pytest.approx(one.history[0]["train/grad_norm"], rel=1e-4)
    # ... and the same Adam step, to 1% of the learning rate (Adam amplifies float noise on
    # coordinates whose gradient is near its eps)
    names = {id(p): n for n, p in one.unwrapped.named_parameters()}
    lr = cfg["train"]["learning_rate"]
    for p in one.trainable:
        other = two["params"][names[id(p)]]
        torch.testing.assert_close(p.detach().cpu(), other, rtol=0, atol=1e-2 * lr)
