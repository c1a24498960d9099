"""DRaFT-K / AlignProp: the truncated sampler equals the rollout, gradients reach the weights through exactly
K steps and match finite differences, and one trainer iteration runs on tiny SD, SD3 and FLUX pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffusion_rl.algorithms.draft import sample_with_truncated_backprop, truncation_steps
from diffusion_rl.config import from_dict
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import make_adapter
from diffusion_rl.rollout import rollout
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures


def _adapter(tiny_pipeline_dir, kind):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.vae, getattr(pipe, "unet", None), getattr(pipe, "transformer", None)):
        if m is not None:
            m.requires_grad_(False)
    return make_adapter(pipe, 16, 16)


@pytest.mark.parametrize(("kind", "kernel"), [("sd", Kernel("ddim", 1.0)), ("sd3", Kernel("ode", 0.0)), ("sd3", Kernel("flow_sde", 0.7))])
def test_truncated_sampler_reproduces_the_rollout(kind, kernel, tiny_pipeline_dir):
    adapter = _adapter(tiny_pipeline_dir, kind)
    emb = adapter.encode(["a red circle", "a blue square"])
    kw = {"num_steps": 3, "guidance_scale": 1.0, "kernel": kernel, "seed": 5, "epoch": 2}
    ref = rollout(adapter, emb, [0, 1], [0, 1], **kw).images
    with torch.no_grad():
        ours = sample_with_truncated_backprop(adapter, adapter.denoiser, emb, [0, 1], [0, 1], backprop_steps=2, **kw)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_gradient_flows_through_exactly_k_denoiser_calls(tiny_pipeline_dir):
    adapter = _adapter(tiny_pipeline_dir, "sd3")
    model = adapter.denoiser
    weight = model.proj_out.weight
    weight.requires_grad_(True)
    grad_enabled = []
    handle = model.register_forward_pre_hook(lambda m, a: grad_enabled.append(torch.is_grad_enabled()))
    emb = adapter.encode(["a red circle"])
    try:
        for k in (1, 3):
            grad_enabled.clear()
            img = sample_with_truncated_backprop(adapter, model, emb, [0], [0], num_steps=4, guidance_scale=1.0,
                                                 kernel=Kernel("ode", 0.0), backprop_steps=k, seed=0, epoch=0)
            assert grad_enabled == [False] * (4 - k) + [True] * k
            (g,) = torch.autograd.grad(img.mean(), weight)
            assert g.abs().sum() > 0
    finally:
        handle.remove()
        weight.requires_grad_(False)
    with pytest.raises(ConfigError, match="backprop_steps"):
        sample_with_truncated_backprop(adapter, model, emb, [0], [0], num_steps=2, guidance_scale=1.0,
                                       kernel=Kernel("ode", 0.0), backprop_steps=3, seed=0, epoch=0)


def test_full_backprop_gradient_matches_finite_differences(tiny_pipeline_dir):
    # with K = T the truncated gradient is the exact gradient of the sampled image's reward
    adapter = _adapter(tiny_pipeline_dir, "sd3")
    model = adapter.denoiser.double()
    adapter.pipeline.vae.double()
    red = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).view(1, 3, 1, 1)
    emb = adapter.encode(["a red circle"]).to(dtype=torch.float64)
    weight = model.proj_out.weight
    kernel = Kernel("ode", 0.0, dtype=torch.float64)

    def f() -> torch.Tensor:
        img = sample_with_truncated_backprop(adapter, model, emb, [0], [0], num_steps=3, guidance_scale=1.0,
                                             kernel=kernel, backprop_steps=3, seed=1, epoch=0)
        return -(img.double() - red).square().mean()  # the mock reward's formula, in float64

    weight.requires_grad_(True)
    (grad,) = torch.autograd.grad(f(), weight)
    weight.requires_grad_(False)
    direction = torch.randn(weight.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    eps = 1e-3  # the adapter returns fp32 denoiser outputs and images, so the difference quotient carries fp32 rounding
    with torch.no_grad():
        weight += eps * direction
        up = f()
        weight -= 2 * eps * direction
        down = f()
        weight += eps * direction
    fd = (up - down) / (2 * eps)
    torch.testing.assert_close((grad * direction).sum(), fd, rtol=1e-3, atol=1e-9)


def test_truncation_steps():
    assert truncation_steps("fixed", 1, 50, 0, 3) == 1
    assert truncation_steps("fixed", 80, 50, 0, 3) == 50
    ks = [truncation_steps("uniform", 5, 50, 0, it) for it in range(200)]
    assert set(ks) == {1, 2, 3, 4, 5}
    assert ks == [truncation_steps("uniform", 5, 50, 0, it) for it in range(200)]  # same on every process
    with pytest.raises(ConfigError, match="draft.backprop_strategy"):
        from_dict({"train": {"algorithm": "draft"}, "draft": {"backprop_strategy": "gaussian"}})


def _draft_config(kind, tmp_path, tiny_pipeline_dir, **train):
    kernel = "ddim" if kind == "sd" else "ode"
    return from_dict({
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "guidance_scale": 1.0, "kernel": kernel, "noise_level": 0.0, "group_size": 2,
                   "prompts_per_iteration": 2, "batch_size": 4},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"algorithm": "draft", "iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, **train},
        "draft": {"backprop_steps": 2},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False, "grid_every": 1},
    })


@pytest.mark.parametrize("kind", ["sd", "sd3", "flux"])
def test_one_draft_iteration_updates_lora_weights(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_draft_config(kind, tmp_path, tiny_pipeline_dir))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert metrics["train/backprop_steps"] == 2.0
    assert metrics["train/grad_norm"] > 0
    assert metrics["reward/mock"] == pytest.approx(-metrics["train/loss"], rel=1e-5)
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.trainable))
    assert trainer.last_images.shape == (4, 3, 16, 16)


def test_draft_refuses_non_differentiable_rewards(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = _draft_config("sd3", tmp_path, tiny_pipeline_dir)
    cfg.reward.rewards = {"jpeg-compressibility": 1.0}
    trainer = Trainer(cfg)
    with pytest.raises(ConfigError, match=r"\['jpeg-compressibility'\] are not differentiable"):
        trainer.train_iteration(0)


def test_draft_raises_the_reward_over_a_few_iterations(tmp_path, tiny_pipeline_dir):
    # smoke version of the ShapesWorld run: a colour reward on a tiny SD3, held-out prompt evaluated by the trainer
    from diffusion_rl.trainer import Trainer

    cfg = _draft_config("sd3", tmp_path, tiny_pipeline_dir, iterations=6, learning_rate=3e-2)
    cfg.prompts.train = ["a red circle", "a red square"]
    cfg.prompts.eval = ["a red star"]
    cfg.log.eval_every = 0
    history = Trainer(cfg).fit()
    evals = [h["eval/mock"] for h in history if "eval/mock" in h]
    assert len(evals) == 2 and evals[-1] > evals[0] + 0.01, evals


@pytest.mark.slow
@pytest.mark.skipif(not (Path(__file__).resolve().parents[2] / "assets/shapesworld/generator/model_index.json").is_file(),
                    reason="needs the ShapesWorld generator asset")
def test_shipped_draft_config_raises_held_out_shapes_eval(tmp_path):
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs/shapes_draft.yaml", [f"log.output_dir={tmp_path}", "log.progress=false"])
    cfg.model.pretrained = str(root / cfg.model.pretrained)
    cfg.reward.options = {k: {**v, "checkpoint": str(root / v["checkpoint"])} for k, v in cfg.reward.options.items()}
    history = Trainer(cfg).fit()
    evals = [h for h in history if "eval/shapes-eval/strict" in h]
    first, last = evals[0], evals[-1]
    se = max(first["eval/shapes-eval/strict_se"], last["eval/shapes-eval/strict_se"])
    # held-out colour-shape pairs, same eval seeds before and after: the rise must exceed 2 standard errors
    assert last["eval/shapes-eval/strict"] - first["eval/shapes-eval/strict"] > 2 * se
