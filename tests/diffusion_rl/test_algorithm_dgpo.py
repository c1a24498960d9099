"""DGPO: the surrogate loss equals Flow-Factory's group DGPO loss transcribed (X-GenGroup/Flow-Factory@90cfd1c
src/flow_factory/trainers/dgpo.py `_compute_group_dgpo_loss` and the DSM clip of `optimize`, one process), its
gradient is the paper's group DPO loss -log sigmoid(-beta/G sum_i A_i (l_i - l_ref_i)) differentiated by autograd
(up to the factor G / (beta B)), the training steps are shared and counter-based, one iteration trains tiny SD3,
FLUX and Wan pipelines, 2 processes equal 1, and a resumed run equals an uninterrupted one bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from diffusion_rl.algorithms.dgpo import DGPO, dgpo_group_loss, dgpo_loss, group_chunks, group_minibatches
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import assert_two_processes_match_one, one_and_two_process_runs


def _flow_factory_group_dgpo_loss(model_v, ref_v, target_v, old_v, advantages, group_indices, num_groups,
                                  group_size, beta_dpo, clip_range):
    """Transcribed from Flow-Factory@90cfd1c trainers/dgpo.py (one process: the all_reduce is the identity;
    clip_range as the (lo, hi) pair of the reference)."""
    batch_size = model_v.shape[0]
    dsm_loss = (target_v - model_v).square().reshape(batch_size, -1).mean(dim=1)
    old_dsm_loss = (target_v - old_v).square().reshape(batch_size, -1).mean(dim=1)
    ratio = torch.exp(-dsm_loss.detach() + old_dsm_loss.detach())
    should_clip = torch.where(advantages > 0, ratio > 1.0 + clip_range[1], ratio < 1.0 + clip_range[0])
    dsm_loss = torch.where(should_clip, dsm_loss.detach(), dsm_loss)
    with torch.no_grad():
        ref_dsm_loss = (target_v - ref_v).square().reshape(batch_size, -1).mean(dim=1)
    delta_diff = dsm_loss.detach() - ref_dsm_loss.detach()
    per_sample_term = advantages * beta_dpo * delta_diff / group_size
    local_group_sums = torch.zeros(num_groups, dtype=per_sample_term.dtype)
    local_group_sums.scatter_add_(0, group_indices, per_sample_term)
    group_weights = torch.sigmoid(local_group_sums.clone().detach())
    local_weights = group_weights[group_indices]
    return (local_weights.detach() * advantages * dsm_loss).mean(), should_clip


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(6, 4, 3, 3, generator=g), torch.randn(6, 4, 3, 3, generator=g)
    target = eps - x0
    ref_v = target + 0.4 * torch.randn(6, 4, 3, 3, generator=g)
    v = target + 0.4 * torch.randn(6, 4, 3, 3, generator=g)
    old_v = v + 0.3 * torch.randn(6, 4, 3, 3, generator=g)  # far enough from v that some ratios leave [0.95, 1.05]
    adv = torch.tensor([1.5, -0.7, -0.8, 0.3, 2.0, -2.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    return x0, eps, target, v, ref_v, old_v, adv, groups


def _err(v, target):
    return ((v - target) ** 2).mean(dim=(1, 2, 3))


@pytest.mark.parity
def test_dgpo_loss_equals_flow_factory_transcribed_on_hand_built_tensors():
    x0, eps, target, v, ref_v, old_v, adv, groups = _tensors()
    v1 = v.clone().requires_grad_(True)
    v2 = v.clone().requires_grad_(True)
    ours, weight, clipped = dgpo_loss(_err(v1, target), _err(ref_v, target), _err(old_v, target), adv, groups,
                                      beta=10.0, group_size=3, clip_range=0.05)
    ref, ref_clip = _flow_factory_group_dgpo_loss(v2, ref_v, target, old_v, adv, groups, 2, 3, 10.0, (-0.05, 0.05))
    assert_close_scaled(ours, ref, rel=1e-6)
    assert torch.equal(clipped.bool(), ref_clip)
    assert 0 < int(ref_clip.sum()) < 6  # both branches of the clip are exercised
    ours.backward()
    ref.backward()
    assert_close_scaled(v1.grad, v2.grad, rel=1e-6)
    # a group's weight is sigmoid(beta / G sum_i A_i (l_i - l_ref_i)), the same for each of its rows
    z0 = float((adv[:3] * 10.0 * (_err(v, target) - _err(ref_v, target))[:3]).sum() / 3)
    assert weight[:3].tolist() == pytest.approx([1 / (1 + math.exp(-z0))] * 3, rel=1e-6)


def test_dgpo_gradient_is_the_papers_group_dpo_loss_gradient():
    """Without clipping, grad of the surrogate == G / (beta B) * grad of sum_g -log sigmoid(-beta/G sum A (l - l_ref)),
    the paper's loss differentiated by autograd (an independent route: no detached weight)."""
    _, _, target, v, ref_v, _, adv, groups = _tensors(1)
    beta, g_size, b = 7.0, 3, 6
    va = v.clone().requires_grad_(True)
    err = _err(va, target)
    surrogate, _, clipped = dgpo_loss(err, _err(ref_v, target), err.detach(), adv, groups, beta, g_size, 0.05)
    assert clipped.sum() == 0  # on-policy: ratio 1 is never clipped
    surrogate.backward()
    vb = v.clone().requires_grad_(True)
    paper = dgpo_group_loss(_err(vb, target), _err(ref_v, target), adv, groups, beta, g_size).sum()
    paper.backward()
    assert_close_scaled(va.grad, vb.grad * g_size / (beta * b), rel=1e-5)
    # and the paper's loss in closed form for group 1
    z1 = float((adv[3:] * beta * (_err(v, target) - _err(ref_v, target))[3:]).sum() / g_size)
    per_group = dgpo_group_loss(_err(v, target), _err(ref_v, target), adv, groups, beta, g_size)
    assert float(per_group[1]) == pytest.approx(math.log(1 + math.exp(z1)), rel=1e-6)


def test_policy_equal_to_reference_gives_weight_one_half_and_zero_advantages_no_gradient():
    _, _, target, v, _, _, adv, groups = _tensors(2)
    va = v.clone().requires_grad_(True)
    err = _err(va, target)
    loss, weight, _ = dgpo_loss(err, err.detach(), err.detach(), torch.zeros(6), groups, 10.0, 3, 0.05)
    loss.backward()
    assert torch.count_nonzero(va.grad) == 0
    _, weight, _ = dgpo_loss(err, err.detach(), err.detach(), adv, groups, 10.0, 3, 0.05)
    assert torch.equal(weight, torch.full((6,), 0.5))


def test_group_chunks_and_minibatches_hold_whole_groups():
    slots = torch.tensor([4, 4, 1, 1, 9, 9, 1])  # rows of three groups, not contiguous
    rows = torch.arange(7)
    chunks = group_chunks(slots, rows, micro_batch_size=5, group_size=2)  # 2 groups per forward
    assert [(r.tolist(), g.tolist()) for r, g in chunks] == [([2, 3, 6, 0, 1], [0, 0, 0, 1, 1]), ([4, 5], [0, 0])]
    assert len(group_chunks(slots, rows, micro_batch_size=1, group_size=2)) == 3  # at least one group per forward
    assert [m.tolist() for m in group_minibatches(slots, 2)] == [[2, 3, 6, 0, 1], [4, 5]]


def test_training_steps_are_shared_distinct_noisy_and_counter_based():
    cfg = from_dict({"preset": "dgpo", "reward": {"rewards": {"mock": 1.0}}})
    algo = DGPO.__new__(DGPO)
    algo.cfg = cfg
    draws = [algo.train_steps(it, 0, 10).tolist() for it in range(50)]
    assert all(len(d) == 4 and len(set(d)) == 4 and max(d) < 6 for d in draws)  # the noisiest 60%
    assert draws == [algo.train_steps(it, 0, 10).tolist() for it in range(50)]  # the same on every process and on resume
    assert len({tuple(d) for d in draws}) > 5


def _dgpo_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "dgpo",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6, "guidance_scale": 1.0},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 3, "timestep_fraction": 1.0, **train},
        "dgpo": {"timesteps": 2},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


@pytest.mark.slow  # the default suite trains DGPO on SD3 in the resume test below
@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_dgpo_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_dgpo_dict(kind, tmp_path, tiny_pipeline_dir)))
    metrics = train_one_iteration(trainer)
    # the LoRA starts at zero: the policy is the reference, so every group's weight is sigmoid(0)
    assert metrics["dgpo/weight"] == pytest.approx(0.5, abs=1e-6) and metrics["dgpo/kl"] == 0.0
    assert metrics["dgpo/clip_fraction"] == 0.0 and metrics["train/grad_norm"] > 0
    assert trainer.policy.steps == 1


@pytest.mark.slow
def test_one_dgpo_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = tiny_video(from_dict(_dgpo_dict("wan", tmp_path, tiny_pipeline_dir, micro_batch_size=2)))
    cfg.sample.group_size, cfg.sample.batch_size = 2, 4
    trainer = Trainer(cfg)
    metrics = train_one_iteration(trainer)
    assert metrics["dgpo/weight"] == pytest.approx(0.5, abs=1e-6) and metrics["train/grad_norm"] > 0
    assert trainer.last_images.shape == (4, 9, 3, 32, 32)


def test_interrupted_and_resumed_dgpo_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters and every metric, bit for bit; two
    minibatches, so the second step's clip sees a moved policy."""
    from diffusion_rl.trainer import Trainer

    extra = {"num_minibatches": 2, "micro_batch_size": 3}
    # the uninterrupted run goes through `diffusion-rl train` with the preset, as a user starts it
    from diffusion_rl.cli import main

    path = tmp_path / "straight.yaml"
    path.write_text(yaml.safe_dump(_dgpo_dict("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2, **extra)))
    assert main(["train", "--config", str(path)]) == 0
    straight = Trainer(from_dict(_dgpo_dict("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2,
                                           resume_from=str(tmp_path / "a" / "sd3" / "checkpoints" / "iter_000002"), **extra)))
    assert straight.iteration == 2
    first = Trainer(from_dict(_dgpo_dict("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=1, **extra)))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"
    resumed = Trainer(from_dict(_dgpo_dict("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2,
                                           resume_from=str(ckpt), **extra)))
    assert resumed.iteration == 1
    resumed.fit()
    assert_resumed_equals_straight(straight, resumed)
    assert straight.history[0]["train/grad_norm"] > 0 and straight.history[0]["dgpo/kl"] >= 0
    assert straight.history[-1]["dgpo/weight"] != pytest.approx(0.5, abs=1e-9)  # the second iteration moved


@pytest.mark.slow
def test_two_process_dgpo_equals_one_process(tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes (each holding whole groups) and the same global batch: the same
    rewards, gradient norm and weights as one process."""
    cfg = _dgpo_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir)
    one, two = one_and_two_process_runs(cfg, tmp_path)
    assert_two_processes_match_one(one, two, cfg["train"]["learning_rate"])


def test_dgpo_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "dgpo", "reward": rw})
    assert cfg.train.algorithm == "dgpo" and cfg.dgpo.beta == 10.0 and cfg.dgpo.timesteps == 4
    assert cfg.train.timestep_fraction == 0.6 and cfg.train.clip_range == 0.05 and cfg.train.kl_beta == 1e-3
    assert cfg.sample.group_size == 24 and cfg.sample.guidance_scale == 4.5 and cfg.model.lora_rank == 64
    assert cfg.advantage.std_scope == "global" and cfg.advantage.clip_max == 5.0
    with pytest.raises(ConfigError, match="dgpo.timesteps"):
        from_dict({"preset": "dgpo", "dgpo": {"timesteps": 0}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "dgpo", "sample": {"group_size": 1}, "reward": rw})
