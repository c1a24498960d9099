"""ZImagePipeline (Z-Image, Z-Image-Turbo) through `diffusion_rl.adapters.z_image` on a tiny config-built pipeline.

References follow the original's code path: the ODE rollout is compared with `ZImagePipeline.__call__` itself
(diffusers 0.42.1) from the same initial latents; the SDE log-probs with a Gaussian density whose mean is built
from the transformer called as pipeline_z_image.py calls it (list inputs, (1000 - t) / 1000, `pos + g (pos -
neg)`, the sign flip) and Flow-GRPO's `sde_step_with_logprob` (yifan123/flow_grpo@54809b5
flow_grpo/diffusers_patch/sd3_sde_with_logprob.py), transcribed, never through the adapter.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.adapters.z_image import Z_IMAGE_LORA_TARGETS, ZImageAdapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import make_adapter
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

H = W = 16  # the tiny VAE's factor is 4 and the transformer patchifies 2 x 2: multiples of 8
MSL = 32
PROMPTS = ["a red circle on the left of a blue square", "a cat"]


@pytest.fixture(scope="module")
def z_folder(tmp_path_factory):
    from mmreward.testing.tiny_z_image import save_tiny_z_image_pipeline

    return save_tiny_z_image_pipeline(tmp_path_factory.mktemp("z_image") / "pipe", seed=0)


@pytest.fixture(scope="module")
def z_pipe(z_folder):
    """Loaded back frozen through the real loader, as a run loads model.pretrained."""
    from diffusion_rl.pipelines import load_pipeline

    return load_pipeline(str(z_folder))


def _pipeline_velocity(pipe, x, t, embeds, neg, g, cfg_normalization=False, cfg_truncation=1.0):
    """ZImagePipeline.__call__'s denoiser step (pipeline_z_image.py, diffusers 0.42.1), transcribed: the velocity
    the scheduler's Euler step takes (minus the guided transformer output)."""
    timestep = (1000 - t.expand(x.shape[0])) / 1000
    g_now = 0.0 if (g > 0 and cfg_truncation <= 1 and float((1000 - t.float()) / 1000) > cfg_truncation) else g
    apply_cfg = g > 0 and g_now > 0
    inp = x.to(pipe.transformer.dtype)
    if apply_cfg:
        inp, caps, timestep = inp.repeat(2, 1, 1, 1), embeds + neg, timestep.repeat(2)
    else:
        caps = embeds
    out = pipe.transformer(list(inp.unsqueeze(2).unbind(dim=0)), timestep, caps, return_dict=False)[0]
    if apply_cfg:
        n = x.shape[0]
        preds = []
        for j in range(n):
            pos, ng = out[j].float(), out[n + j].float()
            pred = pos + g_now * (pos - ng)
            if cfg_normalization and float(cfg_normalization) > 0.0:
                max_norm = torch.linalg.vector_norm(pos) * float(cfg_normalization)
                new_norm = torch.linalg.vector_norm(pred)
                if new_norm > max_norm:
                    pred = pred * (max_norm / new_norm)
            preds.append(pred)
        pred = torch.stack(preds)
    else:
        pred = torch.stack([o.float() for o in out])
    return -pred.squeeze(2)


def test_family_lora_targets_and_schedule(z_pipe):
    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, adapter_class_for

    assert adapter_class_for(z_pipe) == ("z_image", ZImageAdapter)
    assert DEFAULT_LORA_TARGETS["z_image"] == Z_IMAGE_LORA_TARGETS
    names = [n for n, _ in z_pipe.transformer.named_modules()]
    for target in Z_IMAGE_LORA_TARGETS:  # every target names modules of the main, noise- and context-refiner blocks
        hits = [n for n in names if n.endswith("." + target)]
        assert {n.split(".")[0] for n in hits} == {"layers", "noise_refiner", "context_refiner"}, target
    adapter = make_adapter(z_pipe, H, W, MSL)
    assert isinstance(adapter, ZImageAdapter) and adapter.latent_shape() == (4, 4, 4)
    assert make_adapter(z_pipe).height == 1024  # the pipeline's default size
    # Z-Image-Turbo's static shift 3 on linspace(1, 1/N, N) (the pipeline's get_default_z_image_sigmas)
    sched = adapter.schedule(9)
    s = torch.linspace(1.0, 1 / 9, 9).double()
    shifted = 3 * s / (1 + 2 * s)
    assert_close_scaled(sched.a, shifted, rel=1e-6)
    assert_close_scaled(sched.b, torch.cat([shifted[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-6)
    assert not adapter.uses_cfg(0.0) and adapter.uses_cfg(0.5)  # CFG from g > 0, as the pipeline


@pytest.mark.parity
@pytest.mark.parametrize("steps,g,norm,trunc", [
    (9, 0.0, 0.0, 1.0),  # Z-Image-Turbo's model-card sampling: 9 steps, no CFG
    (4, 3.0, 0.995, 0.3),  # CFG renormalisation (caps some samples, not all) and truncation (last 2 steps)
])
def test_ode_rollout_equals_the_z_image_pipeline(z_pipe, steps, g, norm, trunc):
    adapter = make_adapter(z_pipe, H, W, MSL)
    adapter.cfg_normalization, adapter.cfg_truncation = norm, trunc
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=steps, guidance_scale=g,
                   kernel=Kernel("ode", 0.0))
    common = {"height": H, "width": W, "num_inference_steps": steps, "guidance_scale": g, "max_sequence_length": MSL,
              "cfg_normalization": norm or False, "cfg_truncation": trunc}
    ref_lat = z_pipe(prompt=list(PROMPTS), latents=traj.latents[:, 0].clone(), output_type="latent", **common).images
    ref = z_pipe(prompt=list(PROMPTS), latents=traj.latents[:, 0].clone(), output_type="pt", **common).images
    record_parity("z_image", original="diffusers==0.42.1 ZImagePipeline.__call__", how="package",
                  actual=traj.images, expected=ref, cases=[f"{steps} steps, guidance {g}, norm {norm}, trunc {trunc}"])
    assert_close_scaled(traj.latents[:, -1], ref_lat, rel=1e-5)
    torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    assert (traj.images.std(dim=(1, 2, 3)) > 1e-3).all()  # images with content, not a constant


# without CFG: the velocity is the ODE test's 9-step case, the density conformance behaviour 2's formula
@pytest.mark.parametrize("g,trunc", [(3.0, 1.0), (3.0, 0.2)])
def test_sde_log_probs_are_gaussian_densities(z_pipe, g, trunc):
    adapter = make_adapter(z_pipe, H, W, MSL)
    adapter.cfg_normalization, adapter.cfg_truncation = 0.995, trunc
    emb = adapter.encode(PROMPTS)
    kernel = Kernel("flow_sde", 0.7)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=4, guidance_scale=g, kernel=kernel, sde_steps=[0, 1, 2],
                   decode=False)
    caps, _ = z_pipe.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False, max_sequence_length=MSL)
    neg, _ = z_pipe.encode_prompt(["", ""], do_classifier_free_guidance=False, max_sequence_length=MSL)
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift

    z_pipe.scheduler.set_timesteps(sigmas=torch.linspace(1.0, 1 / 4, 4).tolist(), mu=calculate_shift(4))
    sigmas, timesteps = z_pipe.scheduler.sigmas, z_pipe.scheduler.timesteps
    for j in range(3):
        x, x_next = traj.latents[:, j], traj.latents[:, j + 1]
        with torch.no_grad():
            v = _pipeline_velocity(z_pipe, x, timesteps[j], caps, neg, g, 0.995, trunc)
        # Flow-GRPO's sde_step_with_logprob, transcribed (sigma_max = sigmas[1] replaces sigma = 1)
        sigma, sigma_prev, sigma_max = sigmas[j].double(), sigmas[j + 1].double(), float(sigmas[1])
        dt = sigma_prev - sigma
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * 0.7
        mean = x.double() * (1 + std_dev_t**2 / (2 * sigma) * dt) + v.double() * (
            1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        std = float(std_dev_t * torch.sqrt(-dt))
        density = torch.distributions.Normal(mean, std).log_prob(x_next.double()).mean(dim=(1, 2, 3))
        assert_close_scaled(traj.log_probs[:, j].double(), density, rel=1e-5)
        # the training path recomputes the same log-prob
        res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.full((2,), j), traj.schedule, emb, g, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 3] == 0).all() and math.isfinite(float(traj.log_probs.sum()))
    # a training batch mixing a truncated and a guided step gives each sample its own step's prediction
    mixed = step_log_prob(adapter, adapter.denoiser, torch.stack([traj.latents[0, 0], traj.latents[1, 2]]),
                          torch.stack([traj.latents[0, 1], traj.latents[1, 3]]), torch.tensor([0, 2]),
                          traj.schedule, emb, g, kernel)
    assert_close_scaled(mixed.log_prob, torch.stack([traj.log_probs[0, 0], traj.log_probs[1, 2]]), rel=1e-5)


def test_bad_resolutions_and_frame_counts_are_config_errors(z_pipe):
    with pytest.raises(ConfigError, match="multiples of 8"):
        make_adapter(z_pipe, 20, W, MSL)
    with pytest.raises(ConfigError, match="multiples of 8"):
        make_adapter(z_pipe, H, 12, MSL)
    with pytest.raises(ConfigError, match="makes images"):
        make_adapter(z_pipe, H, W, MSL, num_frames=5)
    with pytest.raises(ConfigError, match="cfg_normalization"):
        ZImageAdapter(z_pipe, H, W, MSL, cfg_normalization=-1.0)


def test_cfg_normalization_and_truncation_are_config_keys(z_folder, tmp_path):
    from diffusion_rl.pipelines import adapter_for_config, load_pipeline

    cfg = from_dict_model({"pretrained": str(z_folder), "height": H, "width": W, "max_sequence_length": MSL,
                           "cfg_normalization": 0.995, "cfg_truncation": 0.3})
    adapter = adapter_for_config(load_pipeline(str(z_folder)), cfg)
    assert (adapter.cfg_normalization, adapter.cfg_truncation) == (0.995, 0.3)
    default = adapter_for_config(load_pipeline(str(z_folder)), from_dict_model({"pretrained": str(z_folder)}))
    assert (default.cfg_normalization, default.cfg_truncation) == (0.0, 1.0)  # the pipeline's "off"


def from_dict_model(model: dict):
    from diffusion_rl.config import from_dict

    return from_dict({"model": model, "reward": {"rewards": {"mock": 1.0}}}).model
