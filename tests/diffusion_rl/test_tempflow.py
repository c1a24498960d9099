"""TempFlow-GRPO: the noise-aware weights equal the paper's normalised sigma_t sqrt(dt) computed independently
(and reproduce the authors' hard-coded SD3.5 factor), a branched rollout shares each group's ODE prefix exactly,
its only stochastic step is the branching step (with an independent Gaussian log-density), the trainer feeds
the weights into the policy loss, and one iteration of the preset trains tiny SD3 and FLUX pipelines."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.branching import branched_rollout, designated_steps, noise_aware_weights
from diffusion_rl.config import from_dict
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import Schedule
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures

RW = {"rewards": {"mock": 1.0}}


def _sd35_schedule(num_steps: int = 10) -> Schedule:
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)  # SD3.5-Medium's scheduler config
    sched.set_timesteps(num_steps)
    s = sched.sigmas.to(torch.float64)
    return Schedule(sched.timesteps.clone(), s[:-1].clone(), s[1:].clone())


def _flow_grpo_step_std(s: float, s_next: float, a: float, s_max: float) -> float:
    """sigma_t sqrt(dt) as Flow-GRPO's sde_step_with_logprob computes it (sigma = 1 uses sigmas[1])."""
    denom = s_max if s == 1.0 else s
    return a * math.sqrt(s / (1.0 - denom)) * math.sqrt(s - s_next)


def test_noise_aware_weights_are_the_papers_normalised_sigma_sqrt_dt():
    sched = _sd35_schedule(10)
    s = sched.a.tolist() + [float(sched.b[-1])]
    std = [_flow_grpo_step_std(s[j], s[j + 1], 0.7, s[1]) for j in range(10)]
    trained = list(range(9))  # the reference trains timesteps[:-1]
    mean = sum(std[j] for j in trained) / len(trained)
    want = torch.tensor([x / mean for x in std], dtype=torch.float64)
    got = noise_aware_weights(sched, Kernel("flow_sde", 0.7), trained)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=0)
    assert float(got[trained].mean()) == pytest.approx(1.0, rel=1e-12)
    # early steps weigh more, and the normaliser is the authors' hard-coded 2.25 (scripts/train_sd3_pr.py)
    assert got[0] > got[4] > got[8]
    assert float(got[3]) / std[3] == pytest.approx(2.25, rel=2e-3)
    with pytest.raises(ConfigError, match="no noise"):
        noise_aware_weights(sched, Kernel("ode", 0.0), trained)


def test_designated_steps_are_the_sde_window():
    cfg = from_dict({"preset": "tempflow_grpo", "reward": RW})
    assert designated_steps(cfg.sample) == list(range(9))
    assert designated_steps(from_dict({"sample": {"num_steps": 4}, "reward": RW}).sample) == [0, 1, 2, 3]


def _adapter(tiny_pipeline_dir, kind):
    from diffusers import DiffusionPipeline

    from diffusion_rl.pipelines import make_adapter

    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    pipe.set_progress_bar_config(disable=True)
    return make_adapter(pipe, 16, 16)


def test_branched_rollout_shares_the_prefix_and_branches_only_at_k(tiny_pipeline_dir, monkeypatch):
    from diffusion_rl.rollout import rollout
    from diffusion_rl.seeding import counter_noise

    adapter = _adapter(tiny_pipeline_dir, "sd3")
    emb1 = adapter.encode(["a red circle", "a blue square"])
    emb = emb1.index(torch.tensor([0, 0, 0, 1, 1, 1]))
    pids, sids = [4, 4, 4, 7, 7, 7], [0, 1, 2, 0, 1, 2]
    T, k, gs = 4, 2, 1.0
    kernel = Kernel("flow_sde", 0.7)
    kw = dict(num_steps=T, guidance_scale=gs, kernel=kernel, sde_steps=[k], seed=5, epoch=3, decode=False)

    rows = []
    predict = adapter.predict

    def counting(model, x, *a, **k_):
        rows.append(x.shape[0])
        return predict(model, x, *a, **k_)

    monkeypatch.setattr(adapter, "predict", counting)
    traj = branched_rollout(adapter, emb, pids, sids, share_initial_noise=True, **kw)
    assert sum(rows) == k * 2 + (T - k) * 6  # the prefix runs once per group, the rest once per sample
    rows.clear()
    plain = rollout(adapter, emb, pids, sids, share_initial_noise=True, **kw)
    assert sum(rows) == T * 6
    monkeypatch.setattr(adapter, "predict", predict)

    lat = traj.latents
    assert lat.shape == plain.latents.shape and traj.log_probs.shape == (6, T)
    for g in (slice(0, 3), slice(3, 6)):  # the prefix x_T .. x_k is one tensor per group, bit for bit
        for r in range(1, 3):
            assert torch.equal(lat[g][r, : k + 1], lat[g][0, : k + 1])
        assert not torch.allclose(lat[g][1, k + 1], lat[g][0, k + 1])  # the branches split at step k
    assert not torch.allclose(lat[0, k], lat[3, k])  # two seed groups: two initial noises
    # the same trajectories as an ordinary rollout with one SDE step and a shared x_T
    torch.testing.assert_close(lat, plain.latents, rtol=1e-5, atol=1e-5)
    # only step k is stochastic: zero log-prob elsewhere, and the prefix and suffix are Euler ODE steps
    assert torch.count_nonzero(traj.log_probs[:, [j for j in range(T) if j != k]]) == 0
    assert traj.sde_mask.tolist() == [j == k for j in range(T)]
    sched = adapter.schedule(T)
    x_T = counter_noise(adapter.latent_shape(), 5, 3, pids, [0] * 6, -1, adapter.device)
    torch.testing.assert_close(lat[:, 0], x_T * adapter.initial_noise_scale(), rtol=0, atol=0)
    with torch.no_grad():
        for j in [j for j in range(T) if j != k]:
            t = sched.timesteps[j].expand(6)
            v = adapter.predict(adapter.denoiser, lat[:, j], t, emb, gs).float()
            euler = lat[:, j] + float(sched.b[j] - sched.a[j]) * v
            torch.testing.assert_close(lat[:, j + 1], euler, rtol=1e-5, atol=1e-6)
        # the log-prob of step k is the Gaussian density of Flow-GRPO's SDE step, computed independently
        s, s_next = float(sched.a[k]), float(sched.b[k])
        v = adapter.predict(adapter.denoiser, lat[:, k], sched.timesteps[k].expand(6), emb, gs).float()
        sig = 0.7 * math.sqrt(s / (1 - s))
        mean = lat[:, k] * (1 + sig**2 / (2 * s) * (s_next - s)) + v * (1 + sig**2 * (1 - s) / (2 * s)) * (s_next - s)
        std = sig * math.sqrt(s - s_next)
        dens = torch.distributions.Normal(mean.double(), std).log_prob(lat[:, k + 1].double()).mean(dim=(1, 2, 3))
    torch.testing.assert_close(traj.log_probs[:, k].double(), dens, rtol=1e-5, atol=1e-5 * float(dens.abs().max()))
    # branching at step 0 has no prefix; a window of two steps or independent x_T are refused
    t0 = branched_rollout(adapter, emb, pids, sids, share_initial_noise=True, **{**kw, "sde_steps": [0]})
    assert torch.equal(t0.latents[0, 0], t0.latents[2, 0]) and torch.count_nonzero(t0.log_probs[:, 1:]) == 0
    with pytest.raises(ConfigError, match="sde_window_size: 1"):
        branched_rollout(adapter, emb, pids, sids, share_initial_noise=True, **{**kw, "sde_steps": [1, 2]})
    with pytest.raises(ConfigError, match="share_initial_noise"):
        branched_rollout(adapter, emb, pids, sids, share_initial_noise=False, **kw)


def test_tempflow_config_checks():
    cfg = from_dict({"preset": "tempflow_grpo", "reward": RW})
    assert cfg.sample.branching and cfg.sample.share_initial_noise and cfg.sample.sde_window_size == 1
    assert cfg.ppo.noise_aware_weight and cfg.train.algorithm == "grpo" and cfg.ppo.kl_mode == "exact"
    with pytest.raises(ConfigError, match="share_initial_noise"):
        from_dict({"preset": "tempflow_grpo", "sample": {"share_initial_noise": False}, "reward": RW})
    with pytest.raises(ConfigError, match="sde_window_size: 1"):
        from_dict({"preset": "tempflow_grpo", "sample": {"sde_window_size": 2}, "reward": RW})
    with pytest.raises(ConfigError, match="ppo.noise_aware_weight is read by grpo, grpo_guard, pref_grpo and ddpo, "
                                          "not by train.algorithm nft"):
        from_dict({"train": {"algorithm": "nft"}, "ppo": {"noise_aware_weight": True}, "sample": {"kernel": "ode"},
                   "reward": RW})
    with pytest.raises(ConfigError, match="branching"):
        from_dict({"train": {"algorithm": "draft"}, "sample": {"branching": True, "share_initial_noise": True,
                                                                "sde_window_size": 1}, "reward": RW})
    with pytest.raises(ConfigError, match="sample.branching"):
        from_dict({"sample": {"branching": "yes"}, "reward": RW})


def _tempflow_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict({
        "preset": "tempflow_grpo",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4,
                  "lora_alpha": 4},
        "sample": {"num_steps": 3, "sde_window": [0, 2], "group_size": 3, "prompts_per_iteration": 2,
                   "batch_size": 6, "guidance_scale": 2.0},
        "reward": RW,
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 6, "num_minibatches": 1,
                  "probe": "error", **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False, "eval_every": 0, "grid_every": 0},
    })


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_tempflow_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir, monkeypatch):
    import diffusion_rl.trainer as trainer_mod
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_tempflow_config(kind, tmp_path, tiny_pipeline_dir))
    seen = []
    ppo = trainer_mod.ppo_clip_loss

    def spy(log_prob, old, adv, *a, **kw):
        seen.append(adv.detach().clone())
        return ppo(log_prob, old, adv, *a, **kw)

    monkeypatch.setattr(trainer_mod, "ppo_clip_loss", spy)
    it = 1  # cycling: iteration 1 branches at step 1
    samples = trainer.sde_rollout(trainer.inputs(it))
    batch = samples.batch
    assert batch.traj.sde_mask.tolist() == [False, True, False]
    assert batch.train_steps.flatten().tolist() == [1] * 6
    lat = batch.traj.latents
    assert torch.equal(lat[0, :2], lat[2, :2]) and not torch.equal(lat[0, 2], lat[1, 2])
    sched = trainer.adapter.schedule(3)
    s = sched.a.tolist() + [float(sched.b[-1])]
    std = [_flow_grpo_step_std(s[j], s[j + 1], 0.7, s[1]) for j in range(3)]
    w1 = std[1] / ((std[0] + std[1]) / 2)
    assert float(batch.step_weights[1]) == pytest.approx(w1, rel=1e-5)

    adv, _ = trainer.algorithm.advantages(samples)  # what train_iteration will compute from the same draw
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(it)
    assert math.isfinite(metrics["train/loss"]) and metrics["adv/abs_mean"] > 0
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the training path recomputes step k's log-prob
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))
    # the policy loss saw the group advantages times the noise-aware weight of the branching step
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], adv * w1, rtol=1e-5, atol=1e-6)
