"""AWM: the clipped advantage-weighted matching loss equals Flow-Factory's AWM trainer transcribed
(X-GenGroup/Flow-Factory@a0b2bc5 src/flow_factory/trainers/awm.py: `compute_weighted_log_prob` with 'Uniform'
weighting and the PPO-style loss of `optimize`), zero advantages give zero gradient, at ratio 1 the gradient is
that of mean A ||v - (eps - x0)||^2, one iteration on tiny SD3, FLUX and Wan pipelines trains the LoRA with the
logged loss equal to -mean(clip(A)) recomputed from the sampled advantages, a resumed run equals an uninterrupted one
bit for bit, and 2 processes equal 1."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.algorithms.awm import awm_loss
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video
from tests._helpers.two_process import assert_two_processes_match_one, one_and_two_process_runs


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


def _awm_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "awm",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


def _awm_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict(_awm_dict(kind, tmp_path, tiny_pipeline_dir, **train))


def _spy_advantages(monkeypatch):
    """The advantages AWM's samples are given (RankedSamplesMethod's advantage stage is dpo.rank)."""
    from diffusion_rl.algorithms import dpo as ranked

    seen, real_rank = [], ranked.rank

    def rank_spy(*args, **kwargs):
        out = real_rank(*args, **kwargs)
        seen.append(out[0].clone())
        return out

    monkeypatch.setattr(ranked, "rank", rank_spy)
    return seen


def _check_one_iteration(trainer, monkeypatch):
    """One iteration trains the LoRA, and (one optimizer step, so every micro-batch is on-policy: r = 1, and the
    LoRA starts at zero, so the KL term is 0) the logged loss is -mean(clip(A, -1, 1)) recomputed from the
    advantages the samples were given."""
    seen = _spy_advantages(monkeypatch)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert abs(metrics["awm/ratio"] - 1.0) < 1e-4
    assert metrics["awm/kl"] == 0.0
    assert trainer.policy.steps == 1
    (adv,) = seen
    clipped = adv.double().clamp(-1.0, 1.0)
    # the clip makes the mean non-zero (about 0.02 here), so the check below is not 0 == 0
    assert abs(float(clipped.mean())) > 1e-3
    # micro-batches of 2 of 6 rows: the mean of the chunk means is the mean over rows
    assert metrics["train/loss"] == pytest.approx(float(-clipped.mean()), abs=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable))
    return metrics


@pytest.mark.parametrize("kind", ["sd3", pytest.param("flux", marks=pytest.mark.slow)])
def test_one_awm_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir, monkeypatch):
    from diffusion_rl.trainer import Trainer

    _check_one_iteration(Trainer(_awm_config(kind, tmp_path, tiny_pipeline_dir)), monkeypatch)


@pytest.mark.slow
def test_one_awm_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir, monkeypatch):
    from diffusion_rl.trainer import Trainer

    cfg = tiny_video(_awm_config("wan", tmp_path, tiny_pipeline_dir))
    cfg.sample.group_size, cfg.sample.batch_size = 3, 6
    trainer = Trainer(cfg)
    _check_one_iteration(trainer, monkeypatch)
    assert trainer.last_images.shape == (6, 9, 3, 32, 32)


@pytest.mark.slow
def test_interrupted_and_resumed_awm_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters and every metric, bit for bit; two
    minibatches, so the second step's ratio sees a moved policy."""
    from diffusion_rl.trainer import Trainer

    extra = {"num_minibatches": 2, "micro_batch_size": 3}
    straight = Trainer(_awm_config("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2, **extra))
    straight.fit()
    first = Trainer(_awm_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=1, **extra))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"
    resumed = Trainer(_awm_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2, resume_from=str(ckpt),
                                  **extra))
    assert resumed.iteration == 1
    resumed.fit()
    assert_resumed_equals_straight(straight, resumed)
    assert straight.history[-1]["train/grad_norm"] > 0 and straight.history[-1]["awm/kl"] > 0  # it moved


@pytest.mark.slow
def test_two_process_awm_equals_one_process(tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes (each holding whole groups) and the same global batch: the same
    rewards, gradient norm and weights as one process."""
    cfg = _awm_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir)
    one, two = one_and_two_process_runs(cfg, tmp_path)
    h1, h2 = one.history[0], two["history"][0]
    # the logged loss is process 0's own (half the batch): unequal, so the work was really split in two
    assert h2["train/loss"] != pytest.approx(h1["train/loss"], rel=1e-6, abs=1e-9)
    assert_two_processes_match_one(one, two, cfg["train"]["learning_rate"])


def test_awm_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "awm", "reward": rw})
    assert cfg.train.algorithm == "awm" and cfg.awm.adv_clip == 1.0 and cfg.train.kl_beta == 1e-4
    assert cfg.sample.group_size == 16 and cfg.train.learning_rate == 3e-4 and cfg.model.lora_rank == 32
    with pytest.raises(ConfigError, match="awm.adv_clip"):
        from_dict({"preset": "awm", "awm": {"adv_clip": 0.0}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "awm", "sample": {"group_size": 1}, "reward": rw})
