"""Online Diffusion-DPO: the loss equals the paper's formula computed independently (transcribed from
SalesforceAIResearch/DiffusionDPO@5233e75 train.py lines 1122-1145), best/worst pairs on a hand-built reward
table, one iteration on tiny SD3 and FLUX pipelines changes the LoRA, and a resumed run equals a straight one."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tolerances import assert_close_scaled

from diffusion_rl.algorithms.dpo import best_worst_pairs, dpo_loss, flow_matching_error
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError


def _reference_dpo_loss(model_pred, ref_pred, target, beta_dpo):
    """DiffusionDPO train.py's loss, transcribed: the batch is [winners; losers] along dim 0."""
    model_losses = (model_pred - target).pow(2).mean(dim=[1, 2, 3])
    model_losses_w, model_losses_l = model_losses.chunk(2)
    model_diff = model_losses_w - model_losses_l
    ref_losses = (ref_pred - target).pow(2).mean(dim=[1, 2, 3])
    ref_losses_w, ref_losses_l = ref_losses.chunk(2)
    ref_diff = ref_losses_w - ref_losses_l
    scale_term = -0.5 * beta_dpo
    inside_term = scale_term * (model_diff - ref_diff)
    implicit_acc = (inside_term > 0).sum().float() / inside_term.size(0)
    return -1 * torch.nn.functional.logsigmoid(inside_term).mean(), implicit_acc


@pytest.mark.parametrize("beta", [5000.0, 2.0])
def test_dpo_loss_equals_the_reference_train_py(beta):
    g = torch.Generator().manual_seed(0)
    shape = (6, 4, 3, 3)  # 3 pairs: rows 0-2 winners, 3-5 losers
    x0 = torch.randn(shape, generator=g)
    eps = torch.randn(shape, generator=g)[:3].repeat(2, 1, 1, 1)  # noise shared within a pair
    target = eps - x0
    model_pred = target + 0.05 * torch.randn(shape, generator=g)
    ref_pred = target + 0.05 * torch.randn(shape, generator=g)
    expected, expected_acc = _reference_dpo_loss(model_pred, ref_pred, target, beta)
    err, ref_err = flow_matching_error(model_pred, x0, eps), flow_matching_error(ref_pred, x0, eps)
    loss, acc = dpo_loss(err[:3], err[3:], ref_err[:3], ref_err[3:], beta)
    assert_close_scaled(loss.mean(), expected, rel=1e-6)
    assert float(acc.mean()) == pytest.approx(float(expected_acc))


def test_dpo_loss_closed_form_and_gradient_direction():
    """-log sigmoid(z) at hand-picked errors, and the gradient lowers the winner's error, raises the loser's."""
    err_w = torch.tensor([0.30, 0.10], requires_grad=True)
    err_l = torch.tensor([0.20, 0.40], requires_grad=True)
    ref_w, ref_l = torch.tensor([0.25, 0.25]), torch.tensor([0.25, 0.25])
    loss, acc = dpo_loss(err_w, err_l, ref_w, ref_l, beta=10.0)
    z = [-5.0 * ((0.30 - 0.20) - 0.0), -5.0 * ((0.10 - 0.40) - 0.0)]  # -beta/2 (model diff - ref diff)
    expected = torch.tensor([math.log1p(math.exp(-v)) for v in z])
    assert_close_scaled(loss.detach(), expected, rel=1e-6)
    assert acc.tolist() == [0.0, 1.0]
    loss.sum().backward()
    assert (err_w.grad > 0).all() and (err_l.grad < 0).all()


def test_equal_policy_and_reference_give_log_2():
    e = torch.tensor([0.3, 0.7])
    loss, _ = dpo_loss(e, e.flip(0), e, e.flip(0), beta=5000.0)
    assert_close_scaled(loss, torch.full((2,), math.log(2.0)), rel=1e-7)


def test_best_worst_pairs_on_a_hand_built_reward_table():
    # groups (slots) 3, 3, 3, 5, 5, 5, 7, 7, 7: best/worst rows (1, 2), (3, 5) and a tied group 7
    scores = torch.tensor([0.5, 0.9, 0.1, 2.0, 1.0, -1.0, 0.4, 0.4, 0.4])
    groups = torch.tensor([3, 3, 3, 5, 5, 5, 7, 7, 7])
    win, lose, valid = best_worst_pairs(scores, groups)
    assert win.tolist() == [1, 3, 6] and lose.tolist()[:2] == [2, 5]
    assert valid.tolist() == [1.0, 1.0, 0.0]
    # ties inside a group pick the first row
    win, lose, valid = best_worst_pairs(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    assert (win.tolist(), lose.tolist(), valid.tolist()) == ([0], [2], [1.0])


def _dpo_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "diffusion_dpo",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, "dpo_beta": 50.0, **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


def _dpo_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict(_dpo_dict(kind, tmp_path, tiny_pipeline_dir, **train))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_dpo_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_dpo_config(kind, tmp_path, tiny_pipeline_dir))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    # the LoRA starts at zero (B = 0), so the policy equals the reference: every pair's loss is log 2
    assert metrics["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5)
    assert metrics["dpo/pairs"] == 2.0 and math.isfinite(metrics["train/grad_norm"]) and metrics["train/grad_norm"] > 0
    after = [p.detach().clone() for p in trainer.trainable]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert trainer.last_images.shape == (6, 3, 16, 16)
    assert metrics["train/implicit_acc"] == 0.0  # z = 0 exactly before the step


def test_dpo_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "diffusion_dpo", "reward": rw})
    assert cfg.train.algorithm == "dpo" and cfg.train.dpo_beta == 5000.0 and cfg.sample.kernel == "ode"
    with pytest.raises(ConfigError, match="dpo_beta"):
        from_dict({"preset": "diffusion_dpo", "train": {"dpo_beta": 0.0}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "diffusion_dpo", "sample": {"group_size": 1}, "reward": rw})


def test_dpo_refuses_a_non_flow_model(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = _dpo_config("sd", tmp_path, tiny_pipeline_dir)
    trainer = Trainer(cfg)
    with pytest.raises(ConfigError, match="flow"):
        trainer.train_iteration(0)


def test_interrupted_and_resumed_dpo_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters and every metric, bit for bit."""
    from diffusion_rl.trainer import Trainer

    def without_times(history):
        return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]

    straight = Trainer(_dpo_config("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2))
    straight.fit()
    first = Trainer(_dpo_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=1))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"
    resumed = Trainer(_dpo_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2, resume_from=str(ckpt)))
    assert resumed.iteration == 1
    resumed.fit()
    for a, b in zip(straight.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    assert without_times(resumed.history) == without_times(straight.history)
    assert straight.history[-1]["train/loss"] != pytest.approx(math.log(2.0))  # the second iteration trained a moved LoRA


def test_one_dpo_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir):
    """Wan (text-to-video): pairs of clips, one shared (t, eps) per pair; policy == reference at the start."""
    from diffusion_rl.trainer import Trainer

    cfg = _dpo_config("wan", tmp_path, tiny_pipeline_dir)
    cfg.model.height = cfg.model.width = 32
    cfg.model.num_frames, cfg.model.max_sequence_length = 9, 16
    cfg.sample.group_size, cfg.sample.batch_size = 2, 4
    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert metrics["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5) and metrics["train/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable))
    assert trainer.last_images.shape == (4, 9, 3, 32, 32)


def test_two_process_dpo_equals_one_process(tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes (each holding whole groups, so its own pairs) and the same global
    batch: the same rewards, gradient norm and weights as one process."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    cfg = _dpo_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir)
    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["prompts"]["train"] = ["a red circle", "a blue square", "a green triangle", "a yellow star"]
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launcher = Path(sys.executable).parent / "accelerate"
    proc = subprocess.run([str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "diffusion_rl", "train",
                           "--config", str(path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg["log"]["output_dir"] = str(tmp_path / "dp1")
    one = Trainer(from_dict(cfg))
    one.fit()
    two = read_checkpoint(tmp_path / "dp2" / "sd3" / "checkpoints" / "iter_000001")
    h1, h2 = one.history[0], two["history"][0]
    assert h2["reward/mock"] == pytest.approx(h1["reward/mock"], rel=1e-6, abs=1e-6)
    assert h2["dpo/pairs"] == h1["dpo/pairs"] == 4.0
    assert h2["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-4)
    names = {id(p): n for n, p in one.policy.unwrapped.named_parameters()}
    lr = cfg["train"]["learning_rate"]
    for p in one.trainable:
        torch.testing.assert_close(p.detach().cpu(), two["params"][names[id(p)]], rtol=0, atol=1e-2 * lr)
