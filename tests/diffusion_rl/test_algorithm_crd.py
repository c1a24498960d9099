"""CRD: the decay schedule, implicit reward, centred loss (uniform, dual softmax and hard centring, mse and bce)
and reward-adaptive KL equal Flow-Factory's CRD trainer transcribed (X-GenGroup/Flow-Factory@396dd6e
src/flow_factory/trainers/crd.py: `compute_decay`, `_compute_crd_loss` and `optimize`), applied to one group at a
time; the mse loss has the closed-form gradient; one iteration trains tiny SD3, FLUX and Wan pipelines; 2 processes
equal 1; and a resumed run (with both weight copies) equals an uninterrupted one bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from diffusion_rl.algorithms.crd import crd_kl, crd_loss, decay, implicit_reward
from diffusion_rl.algorithms.nft import optimality_probability
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import assert_two_processes_match_one, one_and_two_process_runs


# -- transcribed from Flow-Factory@396dd6e src/flow_factory/trainers/crd.py ----------------------------------------
def _ff_compute_decay(step, start_step, start_value, slope, end_value):
    if step < start_step:
        return start_value
    return min(start_value + (step - start_step) * slope, end_value)


def _ff_r_theta(forward_pred, old_v_pred, v_target, adaptive_logp):
    if adaptive_logp:
        with torch.no_grad():
            weight_theta = (torch.abs(forward_pred.double() - v_target.double())
                            .mean(dim=tuple(range(1, forward_pred.ndim)), keepdim=True).clip(min=1e-5))
            weight_old = (torch.abs(old_v_pred.double() - v_target.double())
                          .mean(dim=tuple(range(1, old_v_pred.ndim)), keepdim=True).clip(min=1e-5))
        r_theta = -((forward_pred - v_target) ** 2 / weight_theta - (old_v_pred - v_target) ** 2 / weight_old)
    else:
        r_theta = -((forward_pred - v_target) ** 2 - (old_v_pred - v_target) ** 2)
    return r_theta.mean(dim=tuple(range(1, r_theta.ndim)))


def _ff_normalise(adv, adv_clip_range):
    adv_clipped = torch.clamp(adv, adv_clip_range[0], adv_clip_range[1])
    return torch.clamp((adv_clipped / max(adv_clip_range)) / 2.0 + 0.5, 0, 1)


def _ff_crd_loss(adv_cur, r_theta, weight_temp, crd_beta, crd_loss_type):
    """`_compute_crd_loss` with gathered == local (one group) and its ori_policy_loss * adv_clip_max / beta."""
    weight_temp = torch.inf if weight_temp < 0 else weight_temp
    adv_cur_rank, r_theta_gathered, r_theta_local = adv_cur, r_theta.detach(), r_theta

    def one(p):
        rc = adv_cur_rank - (adv_cur * p).sum(dim=0, keepdim=True)
        rtc = r_theta_local - (r_theta_gathered * p).sum(dim=0, keepdim=True).detach()
        if crd_loss_type == "bce":
            return F.binary_cross_entropy_with_logits(crd_beta * rtc, torch.sigmoid(rc.detach()), reduction="mean")
        return ((crd_beta * rtc - rc) ** 2).mean()

    if weight_temp == torch.inf:
        loss = one(torch.softmax(adv_cur / weight_temp, dim=0))
    else:
        if weight_temp == 0:
            plus, minus = adv_cur > 0.0, adv_cur < 0.0
            p = (torch.ones_like(adv_cur) / adv_cur.shape[0] if plus.sum() == 0
                 else torch.softmax(adv_cur.where(plus, torch.tensor(float("-inf"))), dim=0))
            pm = (torch.ones_like(adv_cur) / adv_cur.shape[0] if minus.sum() == 0
                  else torch.softmax(adv_cur.where(minus, torch.tensor(float("-inf"))), dim=0))
        else:
            p, pm = torch.softmax(adv_cur / weight_temp, dim=0), torch.softmax(-adv_cur / weight_temp, dim=0)
        loss = 0.5 * one(p) + 0.5 * one(pm)
    return loss


def _ff_kl(forward_pred, ref_pred, raw_reward, kl_beta, reward_adaptive_kl):
    kl_div = ((forward_pred - ref_pred) ** 2).mean(dim=tuple(range(1, forward_pred.ndim)))
    if reward_adaptive_kl:
        min_coef = 1e-4 / max(kl_beta, 1e-8)
        return kl_beta * torch.mean((min_coef + raw_reward * (1 - min_coef)) * kl_div)
    return kl_beta * kl_div.mean()
# ------------------------------------------------------------------------------------------------------------------


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(8, 4, 3, 3, generator=g), torch.randn(8, 4, 3, 3, generator=g)
    target = eps - x0
    v = target + 0.5 * torch.randn(8, 4, 3, 3, generator=g)
    v_old = target + 0.5 * torch.randn(8, 4, 3, 3, generator=g)
    adv = torch.tensor([6.0, -1.2, 0.4, -3.3, 2.2, -0.1, 0.9, -7.0])  # two beyond the clip of 5
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    return target, v, v_old, adv, groups


def test_decay_schedule_equals_compute_decay():
    for sched in ([0, 0.25, 0.005, 0.999], [75, 0.0, 0.0075, 0.999], [0, 1.0, 0.0, 1.0]):
        for step in (0, 1, 50, 74, 75, 76, 200, 10_000):
            assert decay(step, sched) == pytest.approx(_ff_compute_decay(step, *sched), abs=1e-15)
    assert decay(10_000, [75, 0.0, 0.0075, 0.999]) == 0.999 and decay(10, [75, 0.0, 0.0075, 0.999]) == 0.0


@pytest.mark.parametrize("adaptive", [True, False])
def test_implicit_reward_equals_the_reference(adaptive):
    target, v, v_old, _, _ = _tensors()
    ours = implicit_reward(v, v_old, target, adaptive=adaptive)
    assert_close_scaled(ours.double(), _ff_r_theta(v, v_old, target, adaptive).double(), rel=1e-6)
    assert torch.equal(implicit_reward(v, v, target, adaptive=adaptive), torch.zeros(8))  # no change from old: 0


@pytest.mark.parity
@pytest.mark.parametrize("weight_temp,loss_type", [(-1.0, "mse"), (-1.0, "bce"), (0.5, "mse"), (0.0, "mse"),
                                                   (2.0, "bce")])
def test_crd_loss_equals_the_reference_per_group(weight_temp, loss_type):
    """Our loss centres within each group; the reference's on one group's tensors, averaged over the two (equal-size)
    groups, is the same scalar, with the same gradient w.r.t. the velocity."""
    target, v, v_old, adv, groups = _tensors(1)
    u = optimality_probability(adv, 5.0)
    assert torch.equal(u, _ff_normalise(adv, (-5.0, 5.0)))
    beta = 1.5
    va = v.clone().requires_grad_(True)
    ours = crd_loss(implicit_reward(va, v_old, target, adaptive=True), u, groups, beta, weight_temp, loss_type, 5.0)
    vb = v.clone().requires_grad_(True)
    r = _ff_r_theta(vb, v_old, target, True)
    ref = sum(_ff_crd_loss(u[groups == g], r[groups == g], weight_temp, beta, loss_type) for g in (0, 1)) / 2
    ref = ref * 5.0 / beta
    assert_close_scaled(ours.double(), ref.double(), rel=1e-6)  # fp64 vs the reference's mixed fp32/fp64
    ours.backward()
    ref.backward()
    assert_close_scaled(va.grad, vb.grad, rel=1e-5)


def test_mse_loss_gradient_closed_form():
    """d/dr_i of A_max/beta * mean_i (beta (r_i - mean_g r) - (u_i - mean_g u))^2 with the group mean held constant:
    A_max/beta * 2 beta (beta R_theta_c_i - R_c_i) / N."""
    g = torch.Generator().manual_seed(5)
    r = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.rand(6, generator=g, dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    crd_loss(r, u, groups, 2.0, -1.0, "mse", 5.0).backward()
    rd = r.detach()
    rc = torch.cat([u[:3] - u[:3].mean(), u[3:] - u[3:].mean()])
    rtc = torch.cat([rd[:3] - rd[:3].mean(), rd[3:] - rd[3:].mean()])
    assert_close_scaled(r.grad, 5.0 / 2.0 * 2 * 2.0 * (2.0 * rtc - rc) / 6, rel=1e-12)
    # a constant shift of a group's implicit rewards changes nothing: the loss sees centred rewards only
    shifted = rd + torch.tensor([3.0, 3.0, 3.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    assert float(crd_loss(shifted, u, groups, 2.0, -1.0, "mse", 5.0)) == pytest.approx(
        float(crd_loss(rd, u, groups, 2.0, -1.0, "mse", 5.0)), rel=1e-12)


@pytest.mark.parametrize("adaptive", [True, False])
def test_kl_equals_the_reference(adaptive):
    target, v, v_old, adv, _ = _tensors(2)
    u = optimality_probability(adv, 5.0)
    ours, _ = crd_kl(v, v_old, u, 0.1, reward_adaptive=adaptive)
    assert_close_scaled(ours, _ff_kl(v, v_old, u, 0.1, adaptive), rel=1e-6)


def _crd_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "crd",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 3, "timestep_fraction": 0.34,
                  "num_minibatches": 2, **train},
        "crd": {"kl_cfg": 2.0},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


@pytest.mark.parametrize("kind", ["sd3", pytest.param("flux", marks=pytest.mark.slow)])
def test_one_crd_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_crd_dict(kind, tmp_path, tiny_pipeline_dir)))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0 and trainer.policy.steps == 2
    assert metrics["crd/old_decay"] == 0.25 + 2 * 0.005 and metrics["crd/sampling_decay"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable))
    # the sampling copy's decay was 0: it now equals the trained weights; the old copy is the 0.26 blend
    algo = trainer.algorithm
    for p, s, o, b in zip(trainer.trainable, algo.copies["sampling"], algo.copies["old"], before, strict=True):
        assert torch.equal(s, p.detach())
        torch.testing.assert_close(o, 0.26 * b + 0.74 * p.detach(), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_one_crd_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = tiny_video(from_dict(_crd_dict("wan", tmp_path, tiny_pipeline_dir, micro_batch_size=2, num_minibatches=1)))
    cfg.sample.group_size, cfg.sample.batch_size = 2, 4
    trainer = Trainer(cfg)
    metrics = train_one_iteration(trainer)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert trainer.last_images.shape == (4, 9, 3, 32, 32)


def test_interrupted_and_resumed_crd_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters, both copies and every metric."""
    # the uninterrupted run goes through `diffusion-rl train` with the preset, as a user starts it
    from diffusion_rl.cli import main
    from diffusion_rl.trainer import Trainer

    path = tmp_path / "straight.yaml"
    path.write_text(yaml.safe_dump(_crd_dict("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2)))
    assert main(["train", "--config", str(path)]) == 0
    straight = Trainer(from_dict(_crd_dict("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2,
                                           resume_from=str(tmp_path / "a" / "sd3" / "checkpoints" / "iter_000002"))))
    assert straight.iteration == 2
    first = Trainer(from_dict(_crd_dict("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=1)))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"
    resumed = Trainer(from_dict(_crd_dict("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2,
                                          resume_from=str(ckpt))))
    assert resumed.iteration == 1
    resumed.fit()
    assert_resumed_equals_straight(straight, resumed)
    for c in ("old", "sampling"):
        for a, b in zip(straight.algorithm.copies[c], resumed.algorithm.copies[c], strict=True):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_two_process_crd_equals_one_process(tmp_path, tiny_pipeline_dir):
    cfg = _crd_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir)
    one, two = one_and_two_process_runs(cfg, tmp_path)
    assert_two_processes_match_one(one, two, cfg["train"]["learning_rate"])


def test_crd_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "crd", "reward": rw})
    tc, cc = cfg.train, cfg.crd
    assert tc.algorithm == "crd" and cc.beta == 1.0 and cc.loss == "mse" and cc.weight_temp == -1.0
    assert cc.old_decay == [0.0, 0.25, 0.005, 0.999] and cc.sampling_decay == [75.0, 0.0, 0.0075, 0.999]
    assert tc.kl_beta == 0.1 and cc.kl_cfg == 4.5 and cc.reward_adaptive_kl and tc.num_minibatches == 2
    assert cfg.sample.group_size == 24 and cfg.sample.prompts_per_iteration == 48 and cfg.sample.guidance_scale == 1.0
    with pytest.raises(ConfigError, match="crd.loss"):
        from_dict({"preset": "crd", "crd": {"loss": "l1"}, "reward": rw})
    with pytest.raises(ConfigError, match="crd.old_decay"):
        from_dict({"preset": "crd", "crd": {"old_decay": [0, 1.5, 0, 1]}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "crd", "sample": {"group_size": 1}, "reward": rw})
