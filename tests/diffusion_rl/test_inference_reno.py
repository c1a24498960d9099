"""ReNO: the regulariser against its closed form, the optimiser's first step, best-iterate bookkeeping,
the pull of the noise norm toward its typical value, and smoke runs on tiny real SD / SD3 / FLUX pipelines."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.inference import NoiseToImage, RenoConfig, RewardObjective, norm_regularizer, reno
from diffusion_rl.inference.reno import clip_per_item_
from diffusion_rl.seeding import mix_seed
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import mock_objective, one_thread, sd_generator  # noqa: F401 - shared fixtures


# -- the regulariser ------------------------------------------------------------------------------
def test_regularizer_value_and_gradient_match_closed_form():
    z = torch.randn(3, 4, 5, 6, dtype=torch.float64) * torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64).view(3, 1, 1, 1)
    d = 4 * 5 * 6
    z.requires_grad_(True)
    value = norm_regularizer(z)
    r = z.detach().flatten(1).norm(dim=1)
    expected = 0.5 * r**2 - (d - 1) * torch.log(r)
    torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-5)
    value.sum().backward()
    # d/dz [r^2/2 - (d-1) log r] = z - (d-1) z / r^2
    expected_grad = z.detach() * (1 - (d - 1) / r.view(3, 1, 1, 1) ** 2)
    torch.testing.assert_close(z.grad.double(), expected_grad, rtol=1e-5, atol=1e-6)


def test_regularizer_is_chi_negative_log_density_up_to_a_constant():
    # ||z|| of a d-dim standard normal is chi(d): log p(r) = log p_chi2(r^2) + log(2r)
    d = 64
    chi2 = torch.distributions.Chi2(torch.tensor(float(d), dtype=torch.float64))
    radii = torch.tensor([2.0, 5.0, 7.9, 12.0], dtype=torch.float64)
    z = torch.zeros(len(radii), d, dtype=torch.float64)
    z[:, 0] = radii
    neg_log_p = -(chi2.log_prob(radii**2) + torch.log(2 * radii))
    reg = norm_regularizer(z).double()
    torch.testing.assert_close(reg - reg[0], neg_log_p - neg_log_p[0], rtol=1e-6, atol=1e-4)
    # minimum on the typical shell sqrt(d - 1)
    grid = torch.linspace(1.0, 15.0, 2801, dtype=torch.float64)
    zg = torch.zeros(len(grid), d, dtype=torch.float64)
    zg[:, 0] = grid
    assert abs(float(grid[norm_regularizer(zg).argmin()]) - math.sqrt(d - 1)) < 0.01


def test_clip_per_item_matches_clip_grad_norm_on_each_item():
    g = torch.randn(4, 3, 8, 8) * torch.tensor([0.01, 0.5, 3.0, 0.09]).view(4, 1, 1, 1)
    ours = g.clone()
    norms = clip_per_item_(ours, 0.1)
    for i in range(4):
        p = torch.nn.Parameter(torch.zeros_like(g[i]))
        p.grad = g[i].clone()
        ref_norm = torch.nn.utils.clip_grad_norm_([p], 0.1)
        torch.testing.assert_close(norms[i], ref_norm)
        torch.testing.assert_close(ours[i], p.grad)


def test_config_validation():
    with pytest.raises(ConfigError, match="grad_clip"):
        RenoConfig(grad_clip=0)
    with pytest.raises(ConfigError, match="n_iters"):
        RenoConfig(n_iters=0)
    with pytest.raises(ConfigError, match="nesterov"):
        RenoConfig(momentum=0.0)
    assert RenoConfig.for_model("hyper-sd").lr == 10.0
    assert RenoConfig.for_model("sdxl-turbo").lr == 5.0
    with pytest.raises(ConfigError, match="model"):
        RenoConfig.for_model("sd15")


# -- the optimiser ---------------------------------------------------------------------------------
def test_first_step_is_clipped_nesterov_sgd(sd_generator, mock_objective):
    prompts = ["a red circle", "a blue square"]
    cfg = RenoConfig(n_iters=2, lr=5.0, reg_weight=0.01)
    noise = sd_generator.sample_noise([mix_seed(cfg.seed, i) for i in range(2)])
    res = reno(sd_generator, mock_objective, prompts, cfg, progress=False)
    torch.testing.assert_close(res.initial_noise, noise.cpu())

    # independent computation of z1 = z0 - lr (1 + momentum) clip(grad) (Nesterov with a fresh buffer)
    z = noise.clone().requires_grad_(True)
    images = sd_generator(z, prompts)
    total = mock_objective.terms[0].reward.score(prompts, images).scores
    r = z.flatten(1).norm(dim=1)
    d = z[0].numel()
    loss = -total.sum() + 0.01 * (0.5 * r**2 - (d - 1) * torch.log(r)).sum()
    (grad,) = torch.autograd.grad(loss, z)
    gn = grad.flatten(1).norm(dim=1)
    grad = grad * (0.1 / (gn + 1e-6)).clamp(max=1.0).view(-1, 1, 1, 1)
    z1 = noise - 5.0 * 1.9 * grad
    expected_norms = z1.flatten(1).norm(dim=1)
    torch.testing.assert_close(torch.tensor(res.history[1]["noise_norm"]), expected_norms, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(res.history[0]["grad_norm"]), gn, rtol=1e-4, atol=1e-7)
    assert "grad_norm" not in res.history[-1]  # no step after the last evaluation


def test_best_iterate_is_returned(sd_generator, mock_objective):
    # a huge learning rate makes the trajectory jump around, so the best iterate is rarely the last
    prompts = ["a red circle", "a green star", "a purple dog"]
    cfg = RenoConfig(n_iters=6, lr=400.0, grad_clip=0.1)
    res = reno(sd_generator, mock_objective, prompts, cfg, progress=False)
    totals = torch.tensor([h["total"] for h in res.history])  # (iters, B)
    torch.testing.assert_close(res.best_total, totals.max(dim=0).values)
    torch.testing.assert_close(res.best_iteration, totals.argmax(dim=0))
    assert bool((res.best_iteration < cfg.n_iters - 1).any()), "test needs a case where the last iterate is not best"
    # the returned noise regenerates the returned images and scores
    with torch.no_grad():
        again = sd_generator(res.noise, prompts)
    torch.testing.assert_close(again, res.images, atol=1e-5, rtol=1e-5)
    score = mock_objective(prompts, again)[0]
    torch.testing.assert_close(score, res.best_total, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.best_scores["mock"], res.best_total)
    assert res.initial_total.tolist() == res.history[0]["total"]


def test_reno_raises_a_differentiable_reward_on_every_prompt(sd_generator, mock_objective):
    prompts = ["a red circle", "a blue square", "a yellow star"]
    seen = []
    res = reno(sd_generator, mock_objective, prompts, RenoConfig(n_iters=5), progress=False,
               callback=lambda it, rec: seen.append(it))
    assert seen == list(range(5))
    assert bool((res.best_total > res.initial_total).all())
    assert set(res.history[3]) >= {"iteration", "total", "mock", "noise_norm", "grad_norm"}


def test_regularizer_pulls_noise_norm_to_its_typical_value(sd_generator):
    # reward weight 0: only the regulariser acts; start off the shell on both sides
    objective = RewardObjective.load({"mock": 0.0})
    d = math.prod(sd_generator.noise_shape)
    base = sd_generator.sample_noise([1, 2])
    base = base / base.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * math.sqrt(d)
    start = base * torch.tensor([2.0, 0.5]).view(2, 1, 1, 1)
    res = reno(sd_generator, objective, ["a", "b"], RenoConfig(n_iters=12), noise=start, progress=False)
    norms = torch.tensor([h["noise_norm"] for h in res.history])
    typical = math.sqrt(d - 1)
    gap0 = (norms[0] - typical).abs()
    gap = (norms[-1] - typical).abs()
    assert bool((gap < 0.5 * gap0).all()), (norms[0], norms[-1], typical)
    # without the regulariser the norm does not move at all
    res0 = reno(sd_generator, objective, ["a", "b"], RenoConfig(n_iters=3, reg_weight=0.0), noise=start, progress=False)
    torch.testing.assert_close(torch.tensor(res0.history[-1]["noise_norm"]), norms[0])


def test_non_differentiable_reward_is_refused(sd_generator):
    obj = RewardObjective.load({"mock": 1.0, "jpeg-compressibility": 1.0})
    with pytest.raises(ConfigError, match=r"\['jpeg-compressibility'\] are not differentiable"):
        reno(sd_generator, obj, ["a"], RenoConfig(n_iters=2), progress=False)


# -- pipelines -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_reno_smoke_on_flow_pipelines(kind, tiny_pipeline_dir, mock_objective):
    gen = NoiseToImage.from_pretrained(tiny_pipeline_dir(kind), num_inference_steps=2, height=16, width=16)
    res = reno(gen, mock_objective, ["a red circle"], RenoConfig(n_iters=3), progress=False)
    assert res.images.shape == (1, 3, 16, 16)
    assert res.noise.shape == (1, *gen.noise_shape)
    assert res.history[0]["grad_norm"][0] > 0
    assert res.history[0]["noise_norm"][0] != res.history[1]["noise_norm"][0]  # the noise moved


def test_gradient_checkpointing_gives_the_same_gradient(tiny_pipeline_dir):
    from diffusers import DiffusionPipeline

    grads = []
    for ckpt in (False, True):
        pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir("sd")))
        gen = NoiseToImage(pipe, height=16, width=16, gradient_checkpointing=ckpt)
        z = gen.sample_noise([3]).requires_grad_(True)
        gen(z, ["a red circle"]).pow(2).mean().backward()
        grads.append(z.grad)
    assert pipe.unet.is_gradient_checkpointing
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
