"""PRDP: the loss equals the paper's Eqs. 10-21 and Algorithm 1 written out pair by pair and step by step on
hand-built tensors (Deng et al., CVPR 2024), perfect reward-difference prediction is its zero, the step-by-step
two-pass gradient of a real update equals autograd of the loss built in one graph, `diffusion-rl train` runs the
preset on a tiny SD (the paper's DDPM setting), one iteration trains tiny FLUX and Wan, and the config refuses what
PRDP does not use."""

from __future__ import annotations

import json
import math
from itertools import combinations

import pytest
import torch
import yaml

from diffusion_rl.algorithms.prdp import all_pairs, rdp_loss
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import assert_trained_params_match, launch_two_processes


def _paper_loss(r_hat_t, r_hat_old_t, reward, groups, beta, eps):
    """Algorithm 1 line 10 with Eq. 18, written out: for every prompt n and pair i < j of its samples,
    max(l, l^clip) with r_hat = sum_t r_hat_t (Eq. 10), the step clip of Eq. 20 and its sum (Eq. 21)."""
    total, count = 0.0, 0
    for g in sorted(set(groups)):
        members = [i for i, gi in enumerate(groups) if gi == g]
        for i, j in combinations(members, 2):
            r_i, r_j = sum(r_hat_t[i]), sum(r_hat_t[j])
            c_i = sum(min(max(r_hat_t[i][t], r_hat_old_t[i][t] - eps), r_hat_old_t[i][t] + eps)
                      for t in range(len(r_hat_t[i])))
            c_j = sum(min(max(r_hat_t[j][t], r_hat_old_t[j][t] - eps), r_hat_old_t[j][t] + eps)
                      for t in range(len(r_hat_t[j])))
            target = (reward[i] - reward[j]) / beta
            total += max((r_i - r_j - target) ** 2, (c_i - c_j - target) ** 2)
            count += 1
    return total / count


def test_rdp_loss_equals_the_papers_equations_pair_by_pair():
    g = torch.Generator().manual_seed(0)
    groups = [0, 0, 0, 0, 1, 1, 1, 1]  # N = 2 prompts, B = 4 trajectories each, K = 3 trained steps
    r_hat_old_t = 0.01 * torch.randn(8, 3, generator=g, dtype=torch.float64)
    r_hat_t = r_hat_old_t + 0.004 * torch.randn(8, 3, generator=g, dtype=torch.float64)  # some steps beyond eps
    reward = torch.randn(8, generator=g, dtype=torch.float64)
    for beta, eps in ((10.0, 0.003), (50.0, 1.0)):
        loss, stats = rdp_loss(r_hat_t, r_hat_old_t, reward, all_pairs(torch.tensor(groups)), beta, eps)
        expected = _paper_loss(r_hat_t.tolist(), r_hat_old_t.tolist(), reward.tolist(), groups, beta, eps)
        assert float(loss) == pytest.approx(expected, rel=1e-12)
    assert 0 < float(rdp_loss(r_hat_t, r_hat_old_t, reward, all_pairs(torch.tensor(groups)), 10.0, 0.003)[1][
        "clip_fraction"]) < 1  # the first case clips some steps, so both branches of Eq. 18 are exercised


def test_perfect_reward_difference_prediction_is_the_zero_of_the_loss():
    """Eq. 13: when r_hat(x^a) - r_hat(x^b) = Delta r / beta for every pair (r_hat = r / beta + a per-prompt
    constant, the optimum's form of Eq. 8) the loss and its gradient vanish; shifting one sample's r_hat does not."""
    reward = torch.tensor([0.3, -0.2, 0.9, 0.1, 0.5])
    groups = torch.tensor([0, 0, 0, 1, 1])
    beta = 4.0
    log_z = torch.tensor([0.7, 0.7, 0.7, -1.3, -1.3])
    r_hat = (reward / beta - log_z).unsqueeze(1) * torch.tensor([[0.25, 0.75]])  # split over K = 2 steps
    r_hat = r_hat.clone().requires_grad_()
    loss, _ = rdp_loss(r_hat, r_hat.detach(), reward, all_pairs(groups), beta, eps=1.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-12) and float(r_hat.grad.abs().max()) < 1e-7
    moved = r_hat.detach().clone()
    moved[0, 0] += 0.1
    off, _ = rdp_loss(moved, moved, reward, all_pairs(groups), beta, eps=1.0)
    assert float(off) == pytest.approx(2 * 0.1**2 / 4, rel=1e-5)  # sample 0 is in 2 of the 4 pairs


def test_all_pairs_on_hand_built_groups():
    assert all_pairs(torch.tensor([3, 3, 3, 5, 5])).tolist() == [[0, 1], [0, 2], [1, 2], [3, 4]]
    assert all_pairs(torch.tensor([7, 7])).tolist() == [[0, 1]]


def _prdp_dict(kind, tiny_pipeline_dir, out, **train):
    flow = kind != "sd"
    return {
        "preset": "prdp",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4,
                  "lora_alpha": 4},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "prompts_per_iteration": 2, "group_size": 3, "batch_size": 6,
                   "kernel": "flow_sde" if flow else "ddim", "noise_level": 0.7 if flow else 1.0},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, "clip_range": 1e-2, **train},
        "prdp": {"beta": 0.5},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


def test_two_pass_gradient_equals_autograd_of_the_whole_loss(tmp_path, tiny_pipeline_dir):
    """Tiny SD3: the update's gradient (dl/dr_hat_t from a no-grad pass, then log pi_theta,t backpropagated one
    step at a time) equals the gradient of `rdp_loss` on log-probs computed with grad for every step in one graph."""
    from diffusion_rl.algorithms.base import Rollouts
    from diffusion_rl.algorithms.prdp import reference_model
    from diffusion_rl.rollout import step_log_prob
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_prdp_dict("sd3", tiny_pipeline_dir, tmp_path, num_inner_epochs=1)))
    # move the LoRA off zero so theta != theta_ref and the loss has a non-trivial gradient
    with torch.no_grad():
        for i, p in enumerate(trainer.trainable):
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    batch, order = trainer.collect(0)
    algo, policy, adapter, kernel = trainer.algorithm, trainer.policy, trainer.adapter, trainer.kernel
    traj, k, n = batch.traj, batch.train_steps.shape[1], len(batch.slots)

    def all_log_probs(model):
        return torch.stack([step_log_prob(adapter, model, traj.latents[torch.arange(n), batch.train_steps[:, s]],
                                          traj.latents[torch.arange(n), batch.train_steps[:, s] + 1],
                                          batch.train_steps[:, s], traj.schedule, traj.embeds,
                                          trainer.cfg.sample.guidance_scale, kernel).log_prob for s in range(k)], 1)

    with torch.no_grad(), reference_model(policy) as ref:
        ref_lp = all_log_probs(ref)
    old = torch.stack([traj.log_probs[torch.arange(n), batch.train_steps[:, s]] for s in range(k)], 1)
    tc = trainer.cfg.train
    loss, _ = rdp_loss(all_log_probs(policy.model) - ref_lp, old - ref_lp, algo.combined_reward(batch),
                       all_pairs(batch.slots), trainer.cfg.prdp.beta, tc.clip_range)
    expected = torch.autograd.grad(loss, trainer.trainable)
    assert float(loss.detach()) > 0 and max(float(e.abs().max()) for e in expected) > 0

    captured = []

    def capture():
        captured.extend(p.grad.detach().clone() for p in trainer.trainable)
        policy.optimizer.zero_grad(set_to_none=True)

    policy.step = capture
    metrics = algo.update(Rollouts(batch=batch, order=order), trainer.run)
    assert metrics["train/loss"] == pytest.approx(float(loss), rel=1e-5)
    for got, want in zip(captured, expected, strict=True):
        assert_close_scaled(got, want, rel=1e-4)


def test_diffusion_rl_train_runs_the_prdp_preset_on_tiny_sd(tmp_path, tiny_pipeline_dir):
    """`diffusion-rl train` with `preset: prdp` (DDIM eta 1, the paper's DDPM sampling) on a tiny SD UNet."""
    from diffusion_rl.cli import main

    path = tmp_path / "prdp.yaml"
    path.write_text(yaml.safe_dump(_prdp_dict("sd", tiny_pipeline_dir, tmp_path / "out")))
    assert main(["train", "--config", str(path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == 1 and trained[0]["train/grad_norm"] > 0 and trained[0]["train/loss"] > 0
    # at theta = theta_old the recomputed log-probs are the rollout's: the first minibatch is unclipped
    assert trained[0]["prdp/max_abs_log_ratio_start"] < 1e-5


@pytest.mark.slow  # the default suite runs PRDP on tiny SD3 (gradient test) and SD (preset through the CLI)
@pytest.mark.parametrize("kind", ["flux", "wan"])
def test_one_prdp_iteration_trains_tiny_flux_and_wan(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = from_dict(_prdp_dict(kind, tiny_pipeline_dir, tmp_path))
    trainer = Trainer(tiny_video(cfg) if kind == "wan" else cfg)
    metrics = train_one_iteration(trainer)
    assert math.isfinite(metrics["train/loss"]) and metrics["prdp/max_abs_log_ratio_start"] < 1e-5
    assert "adv/abs_mean" not in metrics and metrics["reward/mock"] == metrics["reward/combined"]


def test_prdp_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "prdp", "reward": rw})
    assert (cfg.prdp.beta, cfg.sample.num_steps, cfg.sample.guidance_scale, cfg.sample.kernel) == (
        10.0, 50, 5.0, "ddim")
    assert (cfg.sample.group_size, cfg.sample.prompts_per_iteration, cfg.train.timestep_fraction) == (16, 32, 1.0)
    full = from_dict({"preset": "prdp", "reward": rw, "model": {"lora": False},
                      "train": {"kl_reference": "copy", "kl_beta": 1e-4}})  # full fine-tuning against a frozen copy
    assert not full.model.lora
    for bad, match in (({"model": {"lora": False}}, "kl_reference: copy"),
                       ({"model": {"lora": False}, "train": {"kl_reference": "copy"}}, "kl_beta > 0"),
                       ({"ppo": {"ratio_norm": True}}, "ppo.ratio_norm is read by grpo, grpo_guard, pref_grpo and ddpo"),
                       ({"ppo": {"noise_aware_weight": True}}, "ppo.noise_aware_weight"),
                       ({"prdp": {"beta": 0.0}}, "prdp.beta"), ({"sample": {"group_size": 1}}, "group_size")):
        with pytest.raises(ConfigError, match=match):
            from_dict({"preset": "prdp", "reward": rw, **bad})


@pytest.mark.slow
def test_prdp_resumes_bit_exact_and_two_processes_equal_one(tmp_path, tiny_pipeline_dir):
    """1 iteration + resume == 2 straight, bit for bit; 2 gloo processes (each with whole groups, so its own pairs)
    with the same global batch give the same rewards, gradient norm and weights as 1 process."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    def run(sub, **train):
        t = Trainer(from_dict(_prdp_dict("sd3", tiny_pipeline_dir, tmp_path / sub, **train)))
        t.fit()
        return t

    straight = run("a", iterations=2)
    run("b", iterations=1)
    resumed = run("b", iterations=2, resume_from=str(tmp_path / "b" / "checkpoints" / "iter_000001"))
    assert_resumed_equals_straight(straight, resumed)

    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(_prdp_dict("sd3", tiny_pipeline_dir, tmp_path / "dp2")))
    launch_two_processes(path)
    one = run("dp1")
    two = read_checkpoint(tmp_path / "dp2" / "checkpoints" / "iter_000001")
    h1, h2 = one.history[0], two["history"][0]
    assert h2["reward/mock"] == pytest.approx(h1["reward/mock"], rel=1e-6)
    assert h2["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-4)
    assert_trained_params_match(one, two["params"], atol=1e-4)
