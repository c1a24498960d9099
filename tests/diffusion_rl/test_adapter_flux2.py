"""Flux2Pipeline (FLUX.2-dev) and Flux2KleinPipeline (FLUX.2-klein base / step-distilled) through
`diffusion_rl.adapters.flux2` on tiny config-built pipelines (mmreward.testing.tiny_flux2), loaded back from disk.

References follow the original's code path: the ODE rollout is compared with `Flux2Pipeline.__call__` /
`Flux2KleinPipeline.__call__` themselves (diffusers 0.42.1) from the same initial latents, with and without a
reference image; the SDE log-probs with a Gaussian density whose mean is built from the transformer called as
pipeline_flux2.py / pipeline_flux2_klein.py call it (the pipeline's own encode_prompt, prepare_latents ids,
timestep / 1000, guidance embedding or two-pass CFG) and Flow-GRPO's `sde_step_with_logprob`
(yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py), transcribed, never through the
adapter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from diffusion_rl.adapters.flux2 import FLUX2_LORA_TARGETS, Flux2Adapter, Flux2KleinAdapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import make_adapter
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

H = W = 32  # the tiny VAE's factor is 2 and latents are packed 2 x 2: multiples of 4; 8 x 8 = 64 tokens
REF = 64  # the pipelines take reference images of at least 64 px a side: edit cases run at 64 x 64
MSL = 48  # the rendered chat templates take ~35 tokens; the rest is padding, as in the pipelines
PROMPTS = ["a red circle on the left of a blue square", "a cat"]
ADAPTER = {"dev": Flux2Adapter, "klein": Flux2KleinAdapter, "klein_distilled": Flux2KleinAdapter}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from mmreward.testing.tiny_flux2 import save_tiny_flux2

    root = tmp_path_factory.mktemp("flux2")
    return {kind: save_tiny_flux2(root / kind, kind, seed=0) for kind in ("dev", "klein", "klein_distilled")}


@pytest.fixture(scope="module")
def pipes(folders):
    """Loaded back frozen through the real loader, as a run loads model.pretrained."""
    from diffusion_rl.pipelines import load_pipeline

    return {kind: load_pipeline(str(folder)) for kind, folder in folders.items()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two REF x REF source images on disk (edit records' sources) and the same as PIL images for the pipeline."""
    from mmreward.edit import EditPrompt

    root = tmp_path_factory.mktemp("flux2_sources")
    rng = np.random.default_rng(0)
    edits, images = [], []
    for i, text in enumerate(PROMPTS):
        img = Image.fromarray(rng.integers(0, 256, (REF, REF, 3), dtype=np.uint8))
        img.save(root / f"src{i}.png")
        edits.append(EditPrompt(text, root / f"src{i}.png"))
        images.append(Image.open(root / f"src{i}.png").convert("RGB"))
    return edits, images


def _unpacked(x: torch.Tensor, size: int = H) -> torch.Tensor:
    """Packed tokens (B, h*w, C) -> the (B, C, h, w) latents `Flux2Pipeline(latents=...)` takes (it packs them
    with `_pack_latents`, checked by the caller)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], size // 4, size // 4)


def _pipeline_velocity(pipe, kind, x, t, g, ref=None, size=H):
    """The denoiser step of Flux2Pipeline / Flux2KleinPipeline.__call__ (diffusers 0.42.1), transcribed: the
    pipeline's own prompt encoding, latent/text ids from prepare_latents/encode_prompt, timestep / 1000, and
    FLUX.2-dev's guidance embedding or klein's two forwards combined neg + g (cond - neg)."""
    pe, text_ids = pipe.encode_prompt(prompt=list(PROMPTS), device="cpu", max_sequence_length=MSL)
    latents, latent_ids = pipe.prepare_latents(x.shape[0], pipe.transformer.config.in_channels // 4, size, size,
                                               pe.dtype, "cpu", None, latents=_unpacked(x, size))
    assert torch.equal(latents, x)  # the pipeline's packing is the inverse of _unpacked
    inp, ids = latents, latent_ids
    if ref is not None:
        imgs = [pipe.image_processor.preprocess(im, height=size, width=size, resize_mode="crop") for im in ref]
        ref_lat, ref_ids = [], []
        for im in imgs:  # one reference per prompt row (the pipeline takes one list for the whole batch)
            lat, rid = pipe.prepare_image_latents([im], 1, None, "cpu", pipe.vae.dtype)
            ref_lat.append(lat)
            ref_ids.append(rid)
        inp = torch.cat([latents, torch.cat(ref_lat)], dim=1)
        ids = torch.cat([latent_ids, torch.cat(ref_ids)], dim=1)
    timestep = t.expand(x.shape[0]).to(x.dtype)
    guidance = torch.full([1], g, dtype=torch.float32).expand(x.shape[0]) if kind == "dev" else None
    out = pipe.transformer(hidden_states=inp, timestep=timestep / 1000, guidance=guidance, encoder_hidden_states=pe,
                           txt_ids=text_ids, img_ids=ids, return_dict=False)[0][:, : x.shape[1]]
    if kind == "klein" and g > 1:
        neg, neg_ids = pipe.encode_prompt(prompt=["", ""], device="cpu", max_sequence_length=MSL)
        uncond = pipe.transformer(hidden_states=inp, timestep=timestep / 1000, guidance=None,
                                  encoder_hidden_states=neg, txt_ids=neg_ids, img_ids=ids,
                                  return_dict=False)[0][:, : x.shape[1]]
        out = uncond + g * (out - uncond)
    return out


def test_families_lora_targets_and_schedule(pipes):
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, adapter_class_for

    assert adapter_class_for(pipes["dev"]) == ("flux2", Flux2Adapter)
    assert adapter_class_for(pipes["klein"]) == ("flux2_klein", Flux2KleinAdapter)
    assert DEFAULT_LORA_TARGETS["flux2"] == DEFAULT_LORA_TARGETS["flux2_klein"] == FLUX2_LORA_TARGETS
    names = [n for n, _ in pipes["dev"].transformer.named_modules()]
    for target in FLUX2_LORA_TARGETS:  # each names Linear layers of the double- or the single-stream blocks
        hits = [n for n in names if n.endswith("." + target)]
        assert hits and all(isinstance(pipes["dev"].transformer.get_submodule(n), torch.nn.Linear) for n in hits)
    assert any(n.startswith("single_transformer_blocks") for n in names if n.endswith(".to_qkv_mlp_proj"))
    adapter = make_adapter(pipes["dev"], H, W, MSL)
    assert adapter.latent_shape() == (64, 16)
    assert make_adapter(pipes["dev"]).height == 256  # the pipeline's default_sample_size x the VAE factor
    # the pipeline's schedule: linspace(1, 1/N, N) shifted exponentially by BFL's empirical mu(seq_len, N)
    for n in (4, 28):
        sched = adapter.schedule(n)
        mu = compute_empirical_mu(64, n)
        s = np.linspace(1.0, 1 / n, n)
        shifted = torch.tensor(math.exp(mu) / (math.exp(mu) + (1 / s - 1)), dtype=torch.float64)
        assert_close_scaled(sched.a, shifted, rel=1e-6)
        assert_close_scaled(sched.b, torch.cat([shifted[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-6)
        assert_close_scaled(sched.timesteps.double(), shifted * 1000, rel=1e-6)
    # guidance: dev embeds it (never CFG); klein base runs CFG above 1; the step-distilled klein never does
    assert not adapter.uses_cfg(4.0) and adapter.guidance_embeds
    klein = make_adapter(pipes["klein"], H, W, MSL)
    assert klein.uses_cfg(4.0) and not klein.uses_cfg(1.0)
    assert not make_adapter(pipes["klein_distilled"], H, W, MSL).uses_cfg(4.0)


@pytest.mark.parity
# FLUX.2-dev (guidance embedding) and klein base (true CFG) on plain prompts: the adapter conformance suite
@pytest.mark.parametrize("kind,steps,g,with_ref", [
    ("klein_distilled", 4, 4.0, False),  # step-distilled klein: 4 steps, the guidance scale ignored
    ("dev", 2, 2.5, True),  # a reference image appended as extra tokens
    ("klein", 2, 3.0, True),  # reference image under CFG (the negative prompt sees it too)
])
def test_ode_rollout_equals_the_flux2_pipeline(pipes, sources, kind, steps, g, with_ref):
    pipe = pipes[kind]
    size = REF if with_ref else H
    adapter = make_adapter(pipe, size, size, MSL)
    assert type(adapter) is ADAPTER[kind]
    edits, images = sources
    emb = adapter.encode(edits if with_ref else PROMPTS)
    assert ("image_latents" in emb.tensors) == with_ref
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=steps, guidance_scale=g, kernel=Kernel("ode", 0.0))
    x0 = traj.latents[:, 0]
    common = {"height": size, "width": size, "num_inference_steps": steps, "guidance_scale": g, "max_sequence_length": MSL}
    ref, ref_lat = [], []
    # the pipeline takes one reference list for the whole batch, so each prompt runs on its own source
    for i in range(len(PROMPTS)):
        kw = {"image": images[i]} if with_ref else {}
        ref.append(pipe(prompt=[PROMPTS[i]], latents=_unpacked(x0[i:i + 1], size).clone(), output_type="pt",
                        **common, **kw).images)
        if kind == "dev":  # Flux2Pipeline's "latent" output is the packed tokens
            ref_lat.append(pipe(prompt=[PROMPTS[i]], latents=_unpacked(x0[i:i + 1], size).clone(), output_type="latent",
                                **common, **kw).images)
    ref = torch.cat(ref)
    record_parity("flux2", original=f"diffusers==0.42.1 {type(pipe).__name__}.__call__", how="package",
                  actual=traj.images, expected=ref,
                  cases=[f"{kind}, {steps} steps, guidance {g}" + (", reference image" if with_ref else "")])
    if ref_lat:
        assert_close_scaled(traj.latents[:, -1], torch.cat(ref_lat), rel=1e-5)
    torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    assert (traj.images.std(dim=(1, 2, 3)) > 1e-3).all()  # images with content, not a constant


@pytest.mark.parametrize("kind,g", [("dev", 2.5), ("klein", 3.0)])
@torch.no_grad()
def test_ode_rollout_with_two_reference_images_equals_the_flux2_pipeline(pipes, sources, kind, g, tmp_path):
    """Edit records with two source images ({"source_images": [...]}): the ODE rollout equals
    Flux2Pipeline / Flux2KleinPipeline(image=[first, second]) from the same noise (each image's tokens appended in
    order at time coordinates 10 and 20; klein's CFG negative sees both); another second image changes the sample;
    a batch mixing one- and two-image records is a ConfigError."""
    from mmreward.edit import EditPrompt

    pipe = pipes[kind]
    edits, images = sources
    a, b = (e.source for e in edits)
    records = [EditPrompt(PROMPTS[0], a, [a, b]), EditPrompt(PROMPTS[1], b, [b, a])]
    adapter = make_adapter(pipe, REF, REF, MSL)
    traj = rollout(adapter, adapter.encode(records), [0, 1], [0, 0], num_steps=2, guidance_scale=g,
                   kernel=Kernel("ode", 0.0))
    x0 = traj.latents[:, 0]
    common = {"height": REF, "width": REF, "num_inference_steps": 2, "guidance_scale": g, "max_sequence_length": MSL}
    ref = torch.cat([pipe(prompt=[PROMPTS[i]], image=[images[i], images[1 - i]], output_type="pt",
                          latents=_unpacked(x0[i:i + 1], REF).clone(), **common).images for i in range(2)])
    record_parity("flux2", original=f"diffusers==0.42.1 {type(pipe).__name__}.__call__", how="package",
                  actual=traj.images, expected=ref, cases=[f"{kind}, 2 steps, guidance {g}, two reference images"])
    torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    # another second image: another condition, another sample from the same noise
    third = tmp_path / "third.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (REF, REF, 3), dtype=np.uint8)).save(third)
    other = rollout(adapter, adapter.encode([EditPrompt(PROMPTS[0], a, [a, third])]), [0], [0], num_steps=2,
                    guidance_scale=g, kernel=Kernel("ode", 0.0), init_latents=x0[:1], decode=False).latents[:, -1]
    # the tiny transformer is weakly coupled to its reference tokens: measured 4.0e-4 (dev) and 1.2e-4 (klein) of the
    # latent scale, against float rounding of ~1e-7 (the parity above holds to 2e-6)
    assert float((other - traj.latents[:1, -1]).abs().max()) > 3e-5 * float(traj.latents[:1, -1].abs().max())
    with pytest.raises(ConfigError, match=r"\[1, 2\] source images.*same number of source images"):
        adapter.encode([records[0], edits[1]])


# plain prompts: the adapter conformance suite (behaviour 2); a reference image under CFG here
@pytest.mark.parametrize("kind,g,with_ref", [("klein", 3.0, True)])
def test_sde_log_probs_are_gaussian_densities(pipes, sources, kind, g, with_ref):
    pipe = pipes[kind]
    size = REF if with_ref else H
    adapter = make_adapter(pipe, size, size, MSL)
    edits, images = sources
    emb = adapter.encode(edits if with_ref else PROMPTS)
    kernel = Kernel("flow_sde", 0.7)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=4, guidance_scale=g, kernel=kernel, sde_steps=[0, 1, 2],
                   decode=False)
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=compute_empirical_mu((size // 4) ** 2, 4))
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    for j in range(3):
        x, x_next = traj.latents[:, j], traj.latents[:, j + 1]
        with torch.no_grad():
            v = _pipeline_velocity(pipe, kind, x, timesteps[j], g, images if with_ref else None, size)
        # Flow-GRPO's sde_step_with_logprob, transcribed (sigma_max = sigmas[1] replaces sigma = 1)
        sigma, sigma_prev, sigma_max = sigmas[j].double(), sigmas[j + 1].double(), float(sigmas[1])
        dt = sigma_prev - sigma
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * 0.7
        mean = x.double() * (1 + std_dev_t**2 / (2 * sigma) * dt) + v.double() * (
            1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        std = float(std_dev_t * torch.sqrt(-dt))
        density = torch.distributions.Normal(mean, std).log_prob(x_next.double()).mean(dim=(1, 2))
        assert_close_scaled(traj.log_probs[:, j].double(), density, rel=1e-5)
        # the training path recomputes the same log-prob
        res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.full((2,), j), traj.schedule, emb, g, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 3] == 0).all() and math.isfinite(float(traj.log_probs.sum()))


def test_bad_resolutions_frame_counts_and_mixed_batches_are_config_errors(pipes, sources):
    for kind in ("dev", "klein"):
        with pytest.raises(ConfigError, match="multiples of 4"):
            make_adapter(pipes[kind], 30, W, MSL)
        with pytest.raises(ConfigError, match="multiples of 4"):
            make_adapter(pipes[kind], H, 18, MSL)
        with pytest.raises(ConfigError, match="makes images"):
            make_adapter(pipes[kind], H, W, MSL, num_frames=5)
    adapter = make_adapter(pipes["dev"], REF, REF, MSL)
    with pytest.raises(ConfigError, match="mixes edit records"):
        adapter.encode([sources[0][0], "a plain prompt"])
    with pytest.raises(ConfigError, match="at least 64px"):  # the pipelines' own limit on reference images
        make_adapter(pipes["dev"], H, W, MSL).encode(sources[0])


def test_klein_recipe_checks_and_trains_one_iteration_with_the_tiny_klein(folders, tmp_path, capsys):
    """configs/grpo_flux2_klein_pickscore.yaml (Flow-Factory's flux2_klein GRPO example) passes `config --check`
    with the tiny step-distilled klein substituted, and one iteration of its method trains the LoRA."""
    from pathlib import Path

    from diffusion_rl.cli import main
    from diffusion_rl.config import load_config
    from diffusion_rl.trainer import Trainer

    recipe = Path(__file__).resolve().parents[2] / "configs" / "grpo_flux2_klein_pickscore.yaml"
    assert "X-GenGroup/Flow-Factory@5f6cda1" in recipe.read_text()
    tiny = f"model.pretrained={folders['klein_distilled']}"
    assert main(["config", "--config", str(recipe), "--check", "--num-processes", "8", tiny]) == 0
    assert "flux2_klein" in capsys.readouterr().out
    cfg = load_config(recipe, [tiny, "model.dtype=float32", "train.mixed_precision='no'", f"model.height={H}",
                               f"model.width={W}", f"model.max_sequence_length={MSL}", "model.lora_rank=4",
                               "model.lora_alpha=4", "sample.prompts_per_iteration=2", "sample.group_size=2",
                               "sample.batch_size=4", "train.micro_batch_size=2", "train.iterations=1",
                               "train.probe=error", "train.learning_rate=1e-2", "train.num_minibatches=1",
                               "reward.rewards={mock: 1.0}", "reward.options={}", "prompts.train=[a red circle, a cat]",
                               "prompts.eval=null", "advantage.min_count=16", f"log.output_dir={tmp_path / 'out'}",
                               "log.progress=false", "log.grid_every=0", "log.eval_every=0"])
    assert (cfg.sample.num_steps, cfg.sample.kernel, cfg.sample.noise_level) == (4, "flow_sde", 0.5)
    trainer = Trainer(cfg)
    assert isinstance(trainer.adapter, Flux2KleinAdapter) and not trainer.adapter.uses_cfg(cfg.sample.guidance_scale)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable)) > 0
