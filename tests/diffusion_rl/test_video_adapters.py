"""CogVideoX and LTX-Video rollouts on tiny config-built pipelines (see tests/diffusion_rl/test_video_rollout.py for Wan): the ODE
path is the pipeline's own sampling, each SDE step's log-prob is a Gaussian density whose mean the test computes
from the transformer itself, decoding gives (B, T, 3, H, W) videos, and one GRPO iteration trains."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import DEFAULT_LORA_TARGETS, make_adapter, pipeline_family
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]
GUIDANCE = 4.0
# CogVideoX: spatial factor 8 x patch 2, temporal factor 4; LTX: spatial 32 (patch 4 x 2^3), temporal 8
COG_H = COG_W = 32
COG_FRAMES = 9  # 3 latent frames
LTX_H = LTX_W = 64
LTX_FRAMES = 17  # 3 latent frames


def _tiny(kind: str, tmp_path_factory):
    from mmreward.testing.tiny_models import frozen_tiny_pipeline

    return frozen_tiny_pipeline(kind, tmp_path_factory.mktemp(f"{kind}_tok"))


@pytest.fixture(scope="module")
def cog_pipe(tmp_path_factory):
    return _tiny("cogvideox", tmp_path_factory)


@pytest.fixture(scope="module")
def ltx_pipe(tmp_path_factory):
    return _tiny("ltx", tmp_path_factory)


def _cfg(out: torch.Tensor, scale: float) -> torch.Tensor:
    uncond, cond = out.float().chunk(2)
    return uncond + scale * (cond - uncond)


# ----------------------------------------------------------------------------------------------
# CogVideoX
# ----------------------------------------------------------------------------------------------
def test_cogvideox_family_latents_and_lora_targets(cog_pipe):
    assert pipeline_family(cog_pipe) == "cogvideox"
    adapter = make_adapter(cog_pipe, COG_H, COG_W, MSL, num_frames=COG_FRAMES)
    assert (adapter.family, adapter.is_flow, adapter.modality) == ("cogvideox", False, "video")
    assert adapter.prediction_type == "v_prediction"
    # channels first, as Wan: (C, T', H', W'), although the pipeline keeps (T', C, H', W')
    assert adapter.latent_shape() == (4, 3, COG_H // 8, COG_W // 8)
    # the pipeline's defaults: sample_height/width (latents) x 8 and sample_frames
    default = make_adapter(cog_pipe)
    assert (default.height, default.width, default.num_frames) == (32, 32, 9)
    names = {n for n, _ in cog_pipe.transformer.named_modules()}
    for target in DEFAULT_LORA_TARGETS["cogvideox"]:
        assert f"transformer_blocks.0.attn1.{target}" in names


@pytest.mark.parametrize("layout", ["1.5", "2b"])
def test_cogvideox_1_5_and_2b_layouts_sample_as_the_pipeline(layout):
    from diffusers import CogVideoXDDIMScheduler

    from mmreward.testing.tiny_models import _tiny_cogvideox

    pipe = _tiny_cogvideox(patch_size_t=2) if layout == "1.5" else _tiny_cogvideox(rotary=False)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = CogVideoXDDIMScheduler.from_config(pipe.scheduler.config)
    adapter = make_adapter(pipe, COG_H, COG_W, MSL, num_frames=COG_FRAMES)
    if layout == "1.5":  # 3 latent frames -> 4, a multiple of patch_size_t = 2, with the padding frame in front
        assert adapter.latent_shape() == (4, 4, 4, 4)
    else:  # fixed sin-cos positions over exactly max_text_seq_length (16) text tokens
        assert adapter.latent_shape() == (4, 3, 4, 4)
        with pytest.raises(ConfigError, match="max_sequence_length=8 does not fit.*max_text_seq_length=16"):
            make_adapter(pipe, COG_H, COG_W, 8, num_frames=COG_FRAMES)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=2, guidance_scale=GUIDANCE,
                   kernel=Kernel("ddim", 0.0))
    kw = {"num_inference_steps": 2, "guidance_scale": GUIDANCE, "height": COG_H, "width": COG_W,
          "num_frames": COG_FRAMES, "max_sequence_length": MSL,
          "latents": traj.latents[:, 0].permute(0, 2, 1, 3, 4).contiguous()}
    ref = pipe(PROMPTS, output_type="latent", **kw).frames
    assert_close_scaled(traj.latents[:, -1].permute(0, 2, 1, 3, 4), ref, rel=1e-5)
    ref_video = pipe(PROMPTS, output_type="pt", **kw).frames  # the padding frame is dropped before decoding
    assert traj.images.shape == (2, COG_FRAMES, 3, COG_H, COG_W) == ref_video.shape
    assert_close_scaled(traj.images, ref_video, rel=1e-5)


def test_cogvideox_bad_frame_counts_and_resolutions_are_config_errors(cog_pipe):
    with pytest.raises(ConfigError, match=r"num_frames - 1 must be a multiple of 4 \(e.g. 9 or 13\)"):
        make_adapter(cog_pipe, COG_H, COG_W, MSL, num_frames=11)
    with pytest.raises(ConfigError, match="multiples of 16 for CogVideoXPipeline"):
        make_adapter(cog_pipe, 40, COG_W, MSL, num_frames=COG_FRAMES)
    from diffusers import FlowMatchEulerDiscreteScheduler

    original = cog_pipe.scheduler
    cog_pipe.scheduler = FlowMatchEulerDiscreteScheduler()
    try:
        with pytest.raises(ConfigError, match="scheduler is a FlowMatchEulerDiscreteScheduler; rollouts need the "
                                              "CogVideoXDDIMScheduler or CogVideoXDPMScheduler"):
            make_adapter(cog_pipe, COG_H, COG_W, MSL, num_frames=COG_FRAMES)
    finally:
        cog_pipe.scheduler = original
    with pytest.raises(ConfigError, match="kernel 'flow_sde' does not fit a cogvideox pipeline: use ddim"):
        adapter = make_adapter(cog_pipe, COG_H, COG_W, MSL, num_frames=COG_FRAMES)
        rollout(adapter, adapter.encode(PROMPTS[:1]), [0], [0], num_steps=2, guidance_scale=1.0,
                kernel=Kernel("flow_sde", 0.7))


# ----------------------------------------------------------------------------------------------
# LTX-Video
# ----------------------------------------------------------------------------------------------
def test_ltx_family_latents_and_lora_targets(ltx_pipe):
    assert pipeline_family(ltx_pipe) == "ltx"
    adapter = make_adapter(ltx_pipe, LTX_H, LTX_W, MSL, num_frames=LTX_FRAMES)
    assert (adapter.family, adapter.is_flow, adapter.modality) == ("ltx", True, "video")
    assert adapter.latent_shape() == (8, 3, 2, 2)  # unpacked, channels first
    default = make_adapter(ltx_pipe)
    assert (default.height, default.width, default.num_frames, default.frame_rate) == (512, 704, 161, 25.0)
    names = {n for n, _ in ltx_pipe.transformer.named_modules()}
    for attn in ("attn1", "attn2"):
        for target in DEFAULT_LORA_TARGETS["ltx"]:
            assert f"transformer_blocks.0.{attn}.{target}" in names


def test_ltx_decode_timestep_and_noise_as_the_pipeline(ltx_pipe):
    from diffusion_rl.video_adapters import LTXAdapter

    # LTX 0.9.1's recommended decode settings: the decoder conditioned on t = 0.05, 2.5% noise mixed in
    adapter = LTXAdapter(ltx_pipe, LTX_H, LTX_W, MSL, LTX_FRAMES, decode_timestep=0.05, decode_noise_scale=0.025)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=2, guidance_scale=GUIDANCE,
                   kernel=Kernel("ode", 0.0))
    # the pipeline draws its decode noise first from the generator when the latents are given: seed 0 = ours
    ref = ltx_pipe(PROMPTS, num_inference_steps=2, guidance_scale=GUIDANCE, height=LTX_H, width=LTX_W,
                   num_frames=LTX_FRAMES, max_sequence_length=MSL, latents=ltx_pipe._pack_latents(traj.latents[:, 0]),
                   decode_timestep=0.05, decode_noise_scale=0.025, generator=torch.Generator().manual_seed(0),
                   output_type="pt").frames
    assert_close_scaled(traj.images, ref, rel=1e-5)
    plain = make_adapter(ltx_pipe, LTX_H, LTX_W, MSL, num_frames=LTX_FRAMES).decode(traj.latents[:, -1])
    assert float((plain - traj.images).abs().max()) > 1e-3  # the decode settings matter, so the match above does


def test_ltx_schedule_is_the_pipelines_shifted_sigmas(ltx_pipe):
    # mu from the sequence length 3 x 2 x 2 = 12 (LTX's base/max shift 0.95/2.05 over 1024..4096 tokens), the
    # exponential time shift exp(mu) / (exp(mu) + 1 / s - 1), then shift_terminal stretches the end to 0.1
    adapter = make_adapter(ltx_pipe, LTX_H, LTX_W, MSL, num_frames=LTX_FRAMES)
    sched = adapter.schedule(4)
    mu = 12 * (2.05 - 0.95) / (4096 - 1024) + 0.95 - (2.05 - 0.95) / (4096 - 1024) * 1024
    s = torch.linspace(1.0, 0.25, 4, dtype=torch.float64)
    shifted = math.exp(mu) / (math.exp(mu) + (1 / s - 1))
    one_minus = 1 - shifted
    stretched = 1 - one_minus / (one_minus[-1] / (1 - 0.1))
    assert_close_scaled(sched.a, stretched, rel=1e-5)
    assert_close_scaled(sched.b, torch.cat([stretched[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-5)
    assert_close_scaled(sched.timesteps.double(), stretched * 1000, rel=1e-5)


# Flow-SDE on LTX: the adapter conformance suite (behaviour 2); DanceGRPO with the mean from the transformer here
@pytest.mark.parametrize("kernel", [Kernel("dance_sde", 0.3)])
def test_ltx_sde_log_probs_are_gaussian_densities(ltx_pipe, kernel):
    adapter = make_adapter(ltx_pipe, LTX_H, LTX_W, MSL, num_frames=LTX_FRAMES)
    emb = adapter.encode(PROMPTS)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=3, guidance_scale=GUIDANCE, kernel=kernel,
                   sde_steps=[0, 1], store_means=True, decode=False)
    pe, mask, neg, neg_mask = ltx_pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=True,
                                                     max_sequence_length=MSL, device="cpu")
    for j in range(2):
        sigma, sigma_next = float(traj.schedule.a[j]), float(traj.schedule.b[j])
        x = traj.latents[:, j]
        with torch.no_grad():  # the transformer called as LTXPipeline calls it, on packed tokens
            out = ltx_pipe.transformer(
                hidden_states=ltx_pipe._pack_latents(torch.cat([x, x])), encoder_hidden_states=torch.cat([neg, pe]),
                timestep=torch.full((4,), sigma * 1000), encoder_attention_mask=torch.cat([neg_mask, mask]),
                num_frames=3, height=2, width=2, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)[0]
        v = ltx_pipe._unpack_latents(_cfg(out, GUIDANCE), 3, 2, 2).double()
        x, dt = x.double(), sigma_next - sigma
        if kernel.name == "flow_sde":  # Flow-GRPO, sigma_1 substituted at sigma = 1
            sigma_t = 0.7 * math.sqrt(sigma / (1 - (sigma_next if sigma >= 1 else sigma)))
            mean = x * (1 + sigma_t**2 / (2 * sigma) * dt) + v * (1 + sigma_t**2 * (1 - sigma) / (2 * sigma)) * dt
            std = sigma_t * math.sqrt(-dt)
        else:  # DanceGRPO
            score = -(x - (1 - sigma) * (x - sigma * v)) / sigma**2
            mean = x + (v - 0.5 * 0.3**2 * score) * dt
            std = 0.3 * math.sqrt(-dt)
        # the mean itself (the log-prob's constant terms would hide a small error in it), then the density
        assert_close_scaled(traj.means[:, j].double(), mean, rel=1e-5)
        density = torch.distributions.Normal(mean, std).log_prob(traj.latents[:, j + 1].double())
        assert_close_scaled(traj.log_probs[:, j].double(), density.mean(dim=(1, 2, 3, 4)), rel=1e-4)
        res = step_log_prob(adapter, adapter.denoiser, traj.latents[:, j], traj.latents[:, j + 1],
                            torch.full((2,), j), traj.schedule, emb, GUIDANCE, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 2] == 0).all()


def test_ltx_bad_frame_counts_and_resolutions_are_config_errors(ltx_pipe):
    with pytest.raises(ConfigError, match=r"num_frames - 1 must be a multiple of 8 \(e.g. 17 or 25\)"):
        make_adapter(ltx_pipe, LTX_H, LTX_W, MSL, num_frames=20)
    with pytest.raises(ConfigError, match="multiples of 32 for LTXPipeline.*e.g. 64x96"):
        make_adapter(ltx_pipe, 80, 96, MSL, num_frames=LTX_FRAMES)
    with pytest.raises(ConfigError, match="frame_rate must be > 0"):
        from diffusion_rl.video_adapters import LTXAdapter

        LTXAdapter(ltx_pipe, LTX_H, LTX_W, MSL, LTX_FRAMES, frame_rate=0)


# ----------------------------------------------------------------------------------------------
# one GRPO iteration through the trainer, each family loaded from its saved folder
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipe_dirs(tiny_pipeline_dir):
    """The session's tiny CogVideoX and LTX pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return {k: str(tiny_pipeline_dir(k)) for k in ("cogvideox", "ltx")}


def test_config_check_names_the_video_families_and_noise_optimisation_refuses_them(pipe_dirs, cog_pipe, ltx_pipe,
                                                                                   capsys):
    from diffusion_rl.config_check import _check_pipeline
    from diffusion_rl.inference.noise_to_image import NoiseToImage

    assert _check_pipeline(pipe_dirs["cogvideox"]).startswith("cogvideox (CogVideoXPipeline, local folder)")
    assert _check_pipeline(pipe_dirs["ltx"]).startswith("ltx (LTXPipeline, local folder)")
    for pipe in (cog_pipe, ltx_pipe):  # ReNO-style noise optimisation is image-only so far
        with pytest.raises(ConfigError, match=f"{type(pipe).__name__} makes videos"):
            NoiseToImage(pipe)
