"""AWM: the clipped advantage-weighted matching loss equals Flow-Factory's AWM trainer transcribed
(X-GenGroup/Flow-Factory@a0b2bc5 src/flow_factory/trainers/awm.py: `compute_weighted_log_prob` with 'Uniform'
weighting and the PPO-style loss of `optimize`), zero advantages give zero gradient, at ratio 1 the gradient is
that of mean A ||v - (eps - x0)||^2, and one iteration on the tiny SD3 pipeline trains the LoRA."""

from __future__ import annotations

import math

import pytest
import torch
from inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from parity_record import record_parity
from tolerances import assert_close_scaled

from diffusion_rl.algorithms.awm import awm_loss
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError


def _flow_factory_awm_loss(model_output, target, old_log_prob, adv, clip_range, adv_clip_range):
    """Transcribed from Flow-Factory@a0b2bc5 trainers/awm.py (Uniform weighting; ranges as (lo, hi) pairs)."""
    model_output, target = model_output.double(), target.double()
    log_prob = -(model_output - target) ** 2
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim))).float()
    adv = torch.clamp(adv, adv_clip_range[0], adv_clip_range[1])
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 + clip_range[0], 1.0 + clip_range[1])
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss)), ratio


@pytest.mark.parity
def test_awm_loss_equals_flow_factory_transcribed_on_hand_built_tensors():
    g = torch.Generator().manual_seed(3)
    x0, eps = torch.randn(6, 4, 3, 3, generator=g), torch.randn(6, 4, 3, 3, generator=g)
    v = eps - x0 + 0.3 * torch.randn(6, 4, 3, 3, generator=g)
    # advantages beyond the clip and old log-probs that push ratios both inside and outside [1 - c, 1 + c]
    adv = torch.tensor([2.5, -1.7, 0.4, -0.2, 0.9, -3.0])
    err = ((v - (eps - x0)) ** 2).mean(dim=(1, 2, 3))
    old = -err + torch.tensor([0.0, 0.5, -0.5, 0.05, -0.05, 0.3])
    ours, ratio = awm_loss(v, x0, eps, adv, old, clip_range=0.2, adv_clip=1.0)
    ref, ref_ratio = _flow_factory_awm_loss(v, eps - x0, old, adv, (-0.2, 0.2), (-1.0, 1.0))
    record_parity("awm", original="X-GenGroup/Flow-Factory@a0b2bc5 src/flow_factory/trainers/awm.py",
                  how="transcribed", actual=ours, expected=ref, cases=("hand-built latents",),
                  not_checked="t, t**2, huber and ghuber weightings (not implemented), EMA-KL")
    assert_close_scaled(ours, ref, rel=1e-5)
    assert_close_scaled(ratio, ref_ratio, rel=1e-5)
    assert not torch.allclose(ratio, torch.ones(6))  # the clipped branches are exercised


def test_zero_advantages_give_zero_gradient_and_ratio_one_gives_weighted_matching():
    g = torch.Generator().manual_seed(4)
    x0, eps = torch.randn(4, 2, 5, 5, generator=g), torch.randn(4, 2, 5, 5, generator=g)
    v = torch.randn(4, 2, 5, 5, generator=g, requires_grad=True)
    err = ((v.detach() - (eps - x0)) ** 2).mean(dim=(1, 2, 3))
    loss, _ = awm_loss(v, x0, eps, torch.zeros(4), -err, clip_range=1.0, adv_clip=1.0)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(v.grad) == 0
    # on-policy (old = current): grad of mean_i A_i ||v_i - (eps_i - x0_i)||^2, computed independently
    adv = torch.tensor([0.8, -0.5, 0.3, -0.9])
    v.grad = None
    awm_loss(v, x0, eps, adv, -err, clip_range=1.0, adv_clip=1.0)[0].backward()
    n = x0[0].numel()
    expected = adv.view(-1, 1, 1, 1) * 2.0 * (v.detach() - (eps - x0)) / n / len(adv)
    assert_close_scaled(v.grad, expected, rel=1e-5)


def _awm_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict({
        "preset": "awm",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    })


def test_one_awm_iteration_trains_the_tiny_sd3_lora(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_awm_config("sd3", tmp_path, tiny_pipeline_dir))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert abs(metrics["awm/ratio"] - 1.0) < 1e-4  # one optimizer step: every micro-batch is on-policy
    assert metrics["awm/kl"] == 0.0  # the LoRA starts at zero: the policy is the reference before the step
    assert trainer.policy.steps == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable))


def test_awm_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "awm", "reward": rw})
    assert cfg.train.algorithm == "awm" and cfg.train.awm_adv_clip == 1.0 and cfg.train.kl_beta == 1e-4
    assert cfg.sample.group_size == 16 and cfg.train.learning_rate == 3e-4 and cfg.model.lora_rank == 32
    with pytest.raises(ConfigError, match="awm_adv_clip"):
        from_dict({"preset": "awm", "train": {"awm_adv_clip": 0.0}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "awm", "sample": {"group_size": 1}, "reward": rw})
