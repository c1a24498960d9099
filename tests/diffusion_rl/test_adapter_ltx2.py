"""LTX2Pipeline (LTX-2, video with audio) through `diffusion_rl.adapters.ltx2` on a tiny config-built pipeline.

References follow the original's code path: the ODE rollout is compared with `LTX2Pipeline.__call__` itself
(diffusers 0.42.1) from the same initial video and audio latents (latents, audio latents, decoded frames and the
vocoder's waveform); the SDE log-probs with a Gaussian density whose mean is built from the transformer called
as pipeline_ltx2.py's denoising loop calls it (connectors on the [negative, positive] batch, packed tokens, rotary
coordinates, x0-space CFG delta per stream, `rescale_noise_cfg`) and Flow-GRPO's `sde_step_with_logprob`
(yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py), transcribed, never through the
adapter.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.adapters.ltx2 import LTX2_LORA_TARGETS, LTX2Adapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import make_adapter
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

H = W = 32  # the tiny video VAE compresses space by 2 (patch 1): multiples of 2
FRAMES = 9  # and time by 2: 5 latent frames
FPS = 25.0
MSL = 16
PROMPTS = ["a robot dancing", "a dog barking"]


@pytest.fixture(scope="module")
def ltx2_folder(tmp_path_factory):
    from mmreward.testing.tiny_ltx2 import save_tiny_ltx2_pipeline

    return save_tiny_ltx2_pipeline(tmp_path_factory.mktemp("ltx2") / "pipe", seed=0)


@pytest.fixture(scope="module")
def ltx2_pipe(ltx2_folder):
    """Loaded back frozen through the real loader, as a run loads model.pretrained."""
    from diffusion_rl.pipelines import load_pipeline

    return load_pipeline(str(ltx2_folder))


def _adapter(pipe, **kw) -> LTX2Adapter:
    adapter = make_adapter(pipe, H, W, MSL, FRAMES)
    adapter.fps = FPS
    for k, v in kw.items():
        setattr(adapter, k, v)
    return adapter


def _call_kwargs(g: float, g_audio: float | None, rescale: float) -> dict:
    # STG and modality-isolation guidance off (the adapter's defaults; both are compared with the pipeline at the
    # end of this file); `audio_* or video` is how the pipeline defaults the audio values, so None picks the video
    # scale there too
    return {"negative_prompt": [""] * len(PROMPTS), "height": H, "width": W, "num_frames": FRAMES,
            "frame_rate": FPS, "guidance_scale": g, "audio_guidance_scale": g_audio, "guidance_rescale": rescale,
            "audio_guidance_rescale": None, "stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0,
            "audio_modality_scale": 1.0, "spatio_temporal_guidance_blocks": None, "max_sequence_length": MSL}


def test_family_lora_targets_and_schedule(ltx2_pipe):
    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, VIDEO_FAMILIES, adapter_class_for

    assert adapter_class_for(ltx2_pipe) == ("ltx2", LTX2Adapter)
    assert DEFAULT_LORA_TARGETS["ltx2"] == LTX2_LORA_TARGETS and "ltx2" in VIDEO_FAMILIES
    names = [n for n, _ in ltx2_pipe.transformer.named_modules()]
    for target in LTX2_LORA_TARGETS:  # video, audio and both cross-modal attentions of every block
        hits = {n.split(".")[2] for n in names if n.endswith("." + target) and n.startswith("transformer_blocks.")}
        assert hits == {"attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
                        "video_to_audio_attn"}, (target, hits)
    adapter = _adapter(ltx2_pipe)
    # (4, 5, 16, 16) video latents + audio: round(9 / 25 s * 16000 / 160 / 4) = 9 frames x (2 channels x 2 mel)
    assert adapter.video_shape() == (4, 5, 16, 16) and adapter.audio_shape() == (9, 4)
    assert adapter.latent_shape() == (4 * 5 * 16 * 16 + 36,)
    x = torch.randn(2, *adapter.latent_shape())
    assert torch.equal(adapter.join_latents(*adapter.split_latents(x)), x)
    # linspace(1, 1/N, N) with the exponential time shift at mu from the packed video length (1280 tokens)
    steps, seq = 5, 5 * 16 * 16
    mu = 0.95 + (2.05 - 0.95) / (4096 - 1024) * (seq - 1024)
    s = torch.linspace(1.0, 1 / steps, steps).double()
    shifted = math.exp(mu) / (math.exp(mu) + (1 / s - 1))
    sched = adapter.schedule(steps)
    assert_close_scaled(sched.a, shifted, rel=1e-6)
    assert_close_scaled(sched.b, torch.cat([shifted[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-6)
    assert not adapter.uses_cfg(1.0) and adapter.uses_cfg(3.0)
    adapter.audio_guidance_scale = 7.0
    assert adapter.uses_cfg(1.0)  # the pipeline guides when either stream's scale is > 1


@pytest.mark.parity
@pytest.mark.parametrize("g,g_audio,rescale", [
    (1.0, None, 0.0),  # no guidance
    (3.0, 7.0, 0.7),  # LTX2Pipeline's call defaults: video 3, audio 7, rescale 0.7 on both streams
])
def test_ode_rollout_equals_the_ltx2_pipeline(ltx2_pipe, g, g_audio, rescale):
    pipe = ltx2_pipe
    adapter = _adapter(pipe, audio_guidance_scale=g_audio, guidance_rescale=rescale)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=3, guidance_scale=g,
                   kernel=Kernel("ode", 0.0))
    video0, _ = adapter.split_latents(traj.latents[:, 0])
    vae = pipe.vae
    # the pipeline normalises the 5-D latents it is given and packs + normalises the 4-D audio latents
    video_in = pipe._denormalize_latents(video0, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    audio_in = adapter.audio_latents(traj.latents[:, 0])
    common = dict(prompt=list(PROMPTS), num_inference_steps=3, **_call_kwargs(g, g_audio, rescale))
    ref_lat = pipe(latents=video_in.clone(), audio_latents=audio_in.clone(), output_type="latent", **common)
    ref = pipe(latents=video_in.clone(), audio_latents=audio_in.clone(), output_type="pt", **common)
    video_n, _ = adapter.split_latents(traj.latents[:, -1])
    video_n = pipe._denormalize_latents(video_n, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    wave = adapter.decode_audio(traj.latents[:, -1])
    case = f"{FRAMES} frames {H}x{W}, 3 steps, guidance {g}/{g_audio}, rescale {rescale}"
    record_parity("ltx2", original="diffusers==0.42.1 LTX2Pipeline.__call__ (video)", how="package",
                  actual=traj.images, expected=ref.frames, cases=[case])
    record_parity("ltx2", original="diffusers==0.42.1 LTX2Pipeline.__call__ (audio waveform)", how="package",
                  actual=wave, expected=ref.audio, cases=[case],
                  not_checked="STG and modality-isolation guidance (off here: stg 0, modality 1; compared in "
                              "test_ode_rollout_with_stg_modality_and_audio_guidance_equals_the_ltx2_pipeline)")
    assert_close_scaled(video_n, ref_lat.frames, rel=1e-5)
    assert_close_scaled(adapter.audio_latents(traj.latents[:, -1]), ref_lat.audio, rel=1e-5)
    assert traj.images.shape == ref.frames.shape == (2, FRAMES, 3, H, W)
    assert_close_scaled(traj.images, ref.frames, rel=1e-5)
    assert wave.shape == ref.audio.shape and wave.shape[:2] == (2, pipe.vocoder.config.out_channels)
    assert_close_scaled(wave, ref.audio, rel=1e-5)
    assert (traj.images.std(dim=(1, 2, 3, 4)) > 1e-3).all() and (wave.std(dim=(1, 2)) > 1e-4).all()


def _pipeline_velocity(pipe, x, j, sigmas, timesteps, prompts, g, g_audio, rescale):
    """The joint velocity pipeline_ltx2.py's denoising loop hands the two schedulers at step j (diffusers
    0.42.1), transcribed: video tokens packed from (C, T', H', W'), audio tokens as given, connectors on the
    [negative, positive] batch, CFG as x0 + (g - 1)(x0_c - x0_u) per stream, then rescale_noise_cfg."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

    n = x.shape[0]
    nv = 4 * 5 * 16 * 16
    video = pipe._pack_latents(x[:, :nv].reshape(n, 4, 5, 16, 16), 1, 1)
    audio = x[:, nv:].reshape(n, 9, 4)
    pe, mask, npe, nmask = pipe.encode_prompt(list(prompts), negative_prompt=[""] * n, do_classifier_free_guidance=True,
                                              max_sequence_length=MSL, device=x.device)
    cfg = g > 1 or g_audio > 1
    if cfg:
        pe, mask = torch.cat([npe, pe]), torch.cat([nmask, mask])
    v_emb, a_emb, c_mask = pipe.connectors(pe, mask, padding_side="left")
    reps = 2 if cfg else 1
    t = timesteps[j].expand(n * reps)
    video_coords = pipe.transformer.rope.prepare_video_coords(n * reps, 5, 16, 16, x.device, fps=FPS)
    audio_coords = pipe.transformer.audio_rope.prepare_audio_coords(n * reps, 9, x.device)
    v, a = pipe.transformer(
        hidden_states=torch.cat([video] * reps), audio_hidden_states=torch.cat([audio] * reps),
        encoder_hidden_states=v_emb, audio_encoder_hidden_states=a_emb, timestep=t, sigma=t,
        encoder_attention_mask=c_mask, audio_encoder_attention_mask=c_mask, num_frames=5, height=16, width=16,
        fps=FPS, audio_num_frames=9, video_coords=video_coords, audio_coords=audio_coords, isolate_modalities=False,
        spatio_temporal_guidance_blocks=None, perturbation_mask=None, use_cross_timestep=True, return_dict=False)
    sigma = sigmas[j]
    out = []
    for state, pred, scale in ((video, v.float(), g), (audio, a.float(), g_audio)):
        if cfg:
            uncond, cond = pred.chunk(2)
            x0_c, x0_u = state - cond * sigma, state - uncond * sigma
            x0 = x0_c + (scale - 1) * (x0_c - x0_u)
        else:
            x0_c = x0 = state - pred * sigma
        if rescale > 0:
            x0 = rescale_noise_cfg(x0, x0_c, guidance_rescale=rescale)
        out.append((state - x0) / sigma)
    video_v = pipe._unpack_latents(out[0], 5, 16, 16, 1, 1)
    return torch.cat([video_v.flatten(1), out[1].flatten(1)], dim=1)


# the no-guidance velocity: the ODE test's first case; the guided density with one scale: the conformance suite
@pytest.mark.parametrize("g,g_audio,rescale", [(3.0, 7.0, 0.7)])
def test_sde_log_probs_are_gaussian_densities(ltx2_pipe, g, g_audio, rescale):
    pipe = ltx2_pipe
    adapter = _adapter(pipe, audio_guidance_scale=g_audio, guidance_rescale=rescale)
    emb = adapter.encode(PROMPTS)
    kernel = Kernel("flow_sde", 0.7)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=4, guidance_scale=g, kernel=kernel, sde_steps=[0, 1, 2],
                   decode=False)
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

    pipe.scheduler.set_timesteps(sigmas=torch.linspace(1.0, 1 / 4, 4).tolist(),
                                 mu=calculate_shift(5 * 16 * 16, 1024, 4096, 0.95, 2.05))
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    for j in range(3):
        x, x_next = traj.latents[:, j], traj.latents[:, j + 1]
        with torch.no_grad():
            v = _pipeline_velocity(pipe, x, j, sigmas, timesteps, PROMPTS, g, g_audio, rescale)
        # Flow-GRPO's sde_step_with_logprob, transcribed (sigma_max = sigmas[1] replaces sigma = 1); the density
        # is the mean over every element of the joint state, video and audio
        sigma, sigma_prev, sigma_max = sigmas[j].double(), sigmas[j + 1].double(), float(sigmas[1])
        dt = sigma_prev - sigma
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * 0.7
        mean = x.double() * (1 + std_dev_t**2 / (2 * sigma) * dt) + v.double() * (
            1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        std = float(std_dev_t * torch.sqrt(-dt))
        density = torch.distributions.Normal(mean, std).log_prob(x_next.double()).mean(dim=1)
        assert_close_scaled(traj.log_probs[:, j].double(), density, rel=1e-5)
        # the training path recomputes the same log-prob
        res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.full((2,), j), traj.schedule, emb, g, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 3] == 0).all() and math.isfinite(float(traj.log_probs.sum()))
    # the SDE explores the audio as well as the frames: both parts differ from the ODE's step
    ode = rollout(adapter, emb, [0, 1], [0, 1], num_steps=4, guidance_scale=g, kernel=Kernel("ode", 0.0), decode=False)
    for part_sde, part_ode in zip(adapter.split_latents(traj.latents[:, 1]), adapter.split_latents(ode.latents[:, 1])):
        assert not torch.allclose(part_sde, part_ode)


def test_bad_geometry_and_settings_are_config_errors(ltx2_pipe):
    with pytest.raises(ConfigError, match="multiples of 2"):
        make_adapter(ltx2_pipe, 31, W, MSL, FRAMES)
    with pytest.raises(ConfigError, match="num_frames=8"):
        make_adapter(ltx2_pipe, H, W, MSL, 8)
    with pytest.raises(ConfigError, match="frame_rate"):
        LTX2Adapter(ltx2_pipe, H, W, MSL, FRAMES, frame_rate=0.0)
    with pytest.raises(ConfigError, match="guidance_rescale"):
        LTX2Adapter(ltx2_pipe, H, W, MSL, FRAMES, guidance_rescale=1.5)
    adapter = _adapter(ltx2_pipe)
    with pytest.raises(ConfigError, match="video then audio"):
        adapter.split_latents(torch.zeros(1, 4, 5, 16, 16))
    with pytest.raises(ConfigError, match="video then audio"):
        adapter.decode(torch.zeros(1, adapter.latent_shape()[0] + 1))


# -- LTX2Pipeline's other guidance terms: spatio-temporal (STG), modality isolation, per-stream audio settings ----
GUIDANCE = {"audio_guidance_scale": 7.0, "guidance_rescale": 0.7, "audio_guidance_rescale": 0.5, "stg_scale": 1.0,
            "audio_stg_scale": 0.5, "modality_scale": 3.0, "audio_modality_scale": 2.0,
            "spatio_temporal_guidance_blocks": [1]}


@pytest.fixture(scope="module")
def ltx2_stg_pipe(tmp_path_factory):
    """The tiny pipeline with STG-capable blocks (transformer config perturbed_attn=True, as LTX-2.3's)."""
    from diffusion_rl.pipelines import load_pipeline
    from mmreward.testing.tiny_ltx2 import save_tiny_ltx2_pipeline

    return load_pipeline(str(save_tiny_ltx2_pipeline(tmp_path_factory.mktemp("ltx2_stg") / "pipe", seed=0,
                                                     perturbed_attn=True)))


def _configured(pipe, **settings) -> LTX2Adapter:
    """The adapter a run builds from its model section (diffusion_rl.pipelines.adapter_for_config)."""
    from diffusion_rl.config import ModelConfig
    from diffusion_rl.pipelines import adapter_for_config

    cfg = ModelConfig(pretrained="unused", height=H, width=W, num_frames=FRAMES, fps=FPS, max_sequence_length=MSL,
                      **settings)
    return adapter_for_config(pipe, cfg)


@pytest.mark.parity
@torch.no_grad()
def test_ode_rollout_with_stg_modality_and_audio_guidance_equals_the_ltx2_pipeline(ltx2_stg_pipe):
    """Every guidance term LTX2Pipeline.__call__ adds (diffusers 0.42.1: CFG, STG at the named blocks, modality
    isolation, per-stream audio scales, rescale) set from run-config keys: the ODE rollout's final video and audio
    latents equal the pipeline's from the same initial latents to rel 1e-5 of their scale (float32 rounding of the
    extra passes); each extra term moves one step's result by far more than that tolerance."""
    pipe = ltx2_stg_pipe
    adapter = _configured(pipe, **GUIDANCE)
    assert adapter.spatio_temporal_guidance_blocks == [1] and adapter.audio_modality_scale == 2.0
    emb = adapter.encode(PROMPTS)

    def final(a: LTX2Adapter) -> torch.Tensor:
        return rollout(a, emb, [0, 1], [0, 0], num_steps=3, guidance_scale=3.0, kernel=Kernel("ode", 0.0),
                       decode=False).latents

    traj = final(adapter)
    video0, _ = adapter.split_latents(traj[:, 0])
    vae = pipe.vae
    video_in = pipe._denormalize_latents(video0, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    kw = {**_call_kwargs(3.0, GUIDANCE["audio_guidance_scale"], GUIDANCE["guidance_rescale"]), **GUIDANCE}
    ref = pipe(prompt=list(PROMPTS), num_inference_steps=3, latents=video_in.clone(),
               audio_latents=adapter.audio_latents(traj[:, 0]).clone(), output_type="latent", **kw)
    video_n, _ = adapter.split_latents(traj[:, -1])
    video_n = pipe._denormalize_latents(video_n, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    assert_close_scaled(video_n, ref.frames, rel=1e-5)
    assert_close_scaled(adapter.audio_latents(traj[:, -1]), ref.audio, rel=1e-5)
    record_parity("ltx2", original="diffusers==0.42.1 LTX2Pipeline.__call__ (STG, modality, audio guidance)",
                  how="package", actual=video_n, expected=ref.frames,
                  cases=["3 steps, cfg 3/7, stg 1/0.5 at block 1, modality 3/2, rescale 0.7/0.5"])
    # each term reaches the velocity: one Euler step from the same x_T (x_T - v) with the term off moves the state
    # by more than 1e-3 of its scale (measured 7.7e-3 to 0.54; one step instead of the three above: each term
    # costs extra transformer passes per step)
    def one_step(a: LTX2Adapter) -> torch.Tensor:
        return rollout(a, emb, [0, 1], [0, 0], num_steps=1, guidance_scale=3.0, kernel=Kernel("ode", 0.0),
                       decode=False, init_latents=traj[:, 0]).latents[:, -1]

    on = one_step(adapter)
    scale = float(on.abs().max())
    for off in ({"stg_scale": 0.0, "audio_stg_scale": 0.0}, {"modality_scale": 1.0, "audio_modality_scale": 1.0},
                {"audio_stg_scale": 0.0}, {"audio_guidance_rescale": 0.0}):
        other = one_step(_configured(pipe, **{**GUIDANCE, **off}))
        assert float((other - on).abs().max()) > 1e-3 * scale, off


def test_bad_guidance_settings_are_config_errors(ltx2_pipe, ltx2_stg_pipe):
    from diffusion_rl.config import ModelConfig

    with pytest.raises(ConfigError, match="model.stg_scale"):
        ModelConfig(pretrained="x", stg_scale=-1.0)
    with pytest.raises(ConfigError, match="spatio_temporal_guidance_blocks"):
        _configured(ltx2_stg_pipe, stg_scale=1.0)  # STG without blocks (the pipeline's ValueError)
    with pytest.raises(ConfigError, match="blocks 0..1"):
        _configured(ltx2_stg_pipe, stg_scale=1.0, spatio_temporal_guidance_blocks=[28])
    with pytest.raises(ConfigError, match="perturbed_attn=False"):  # STG would change nothing on this transformer
        _configured(ltx2_pipe, stg_scale=1.0, spatio_temporal_guidance_blocks=[0])
    with pytest.raises(ConfigError, match=r"audio_guidance_rescale must be in \[0, 1\]"):
        _configured(ltx2_pipe, audio_guidance_rescale=2.0)
    adapter = _adapter(ltx2_stg_pipe)
    with pytest.raises(ConfigError, match="modality_scale must be a finite number"):
        adapter.configure_guidance(modality_scale=float("nan"))
    with pytest.raises(ConfigError, match="do not exist"):
        adapter.configure_guidance(cfg_scale=2.0)
    assert adapter.modality_scale == 1.0 and adapter.stg_scale == 0.0  # a rejected setting changes nothing
