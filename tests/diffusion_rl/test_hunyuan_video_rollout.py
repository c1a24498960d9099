"""HunyuanVideo rollouts on a tiny config-built HunyuanVideoPipeline: the ODE path is the pipeline's own sampling
(FlowMatchEuler with shift, embedded guidance, no CFG), SDE log-probs are Gaussian densities over
(B, C, T', H', W') latents, decoding gives (B, T, 3, H, W) videos, and one GRPO iteration trains a LoRA."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.pipelines import DEFAULT_LORA_TARGETS, make_adapter, pipeline_family
from mmreward.errors import ConfigError
from tests._helpers.tolerances import assert_close_scaled

H = W = 32
FRAMES = 9  # (9 - 1) / 4 + 1 = 3 latent frames
MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def hv_pipe(tmp_path_factory):
    from mmreward.testing.tiny_models import frozen_tiny_pipeline

    return frozen_tiny_pipeline("hunyuan_video", tmp_path_factory.mktemp("hv_tok"))


def test_hunyuan_video_family_geometry_and_lora_targets(hv_pipe):
    assert pipeline_family(hv_pipe) == "hunyuan_video"
    adapter = make_adapter(hv_pipe, H, W, MSL, num_frames=FRAMES)
    assert adapter.modality == "video" and adapter.is_flow
    assert adapter.latent_shape() == (4, 3, H // 8, W // 8)
    # the pipeline's defaults when nothing is given: 720 x 1280, 129 frames -> 33 latent frames
    assert make_adapter(hv_pipe).latent_shape() == (4, 33, 90, 160)
    # guidance-distilled: no CFG pass at any guidance scale
    assert not adapter.uses_cfg(6.0)
    # LoRA targets name modules of the dual-stream (joint) and single-stream attention
    names = {n for n, _ in hv_pipe.transformer.named_modules()}
    for target in DEFAULT_LORA_TARGETS["hunyuan_video"]:
        assert f"transformer_blocks.0.attn.{target}" in names
    for target in ("to_q", "to_k", "to_v"):
        assert f"single_transformer_blocks.0.attn.{target}" in names


def test_prompt_template_is_cropped_and_the_mask_kept(hv_pipe):
    # the tiny Llama tokenizer splits the template as Llama-3 does, so crop_start = 95 leaves the prompt's
    # tokens and its <|eot_id|> first: "a red circle moving left" = 5 words + eot -> 6 real tokens, then padding
    emb = make_adapter(hv_pipe, H, W, MSL, num_frames=FRAMES).encode(PROMPTS)
    mask = emb.tensors["prompt_attention_mask"]
    assert emb.tensors["prompt_embeds"].shape == (2, MSL, 16) and emb.tensors["pooled_prompt_embeds"].shape == (2, 32)
    assert mask.sum(dim=1).tolist() == [6, 6]
    assert mask[:, :6].all() and not mask[:, 6:].any()


def test_schedule_is_the_shifted_euler_sigmas_of_the_pipeline(hv_pipe):
    # sigmas linspace(1, 0, N + 1)[:-1], shifted by the scheduler's shift 7: 7 s / (1 + 6 s), then 0
    sched = make_adapter(hv_pipe, H, W, MSL, num_frames=FRAMES).schedule(4)
    s = torch.tensor([1.0, 0.75, 0.5, 0.25], dtype=torch.float64)
    shifted = 7 * s / (1 + 6 * s)
    assert_close_scaled(sched.a, shifted, rel=1e-6)
    assert_close_scaled(sched.b, torch.cat([shifted[1:], torch.zeros(1, dtype=torch.float64)]), rel=1e-6)
    assert_close_scaled(sched.timesteps.double(), shifted * 1000, rel=1e-6)


def test_decode_gives_videos_in_the_unit_interval(hv_pipe):
    adapter = make_adapter(hv_pipe, H, W, MSL, num_frames=13)
    latents = torch.randn(2, *adapter.latent_shape(), generator=torch.Generator().manual_seed(0))
    video = adapter.decode(latents)
    assert video.shape == (2, 13, 3, H, W) and video.dtype == torch.float32
    # the VAE's own decode of latents / scaling_factor, frames moved ahead of channels
    vae = hv_pipe.vae
    with torch.no_grad():
        ref = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0].permute(0, 2, 1, 3, 4)
    assert_close_scaled(video, (ref / 2 + 0.5).clamp(0, 1), rel=1e-6)
    with pytest.raises(ConfigError, match=r"expected \(B, C, T', H', W'\) video latents"):
        adapter.decode(latents[:, :, 0])


def test_bad_frame_counts_and_resolutions_are_config_errors(hv_pipe):
    with pytest.raises(ConfigError, match=r"num_frames=8 cannot be made by HunyuanVideoPipeline.*\(e.g. 5 or 9\)"):
        make_adapter(hv_pipe, H, W, MSL, num_frames=8)
    with pytest.raises(ConfigError, match="multiples of 16 for HunyuanVideoPipeline"):
        make_adapter(hv_pipe, 40, W, MSL, num_frames=FRAMES)
    with pytest.raises(ConfigError, match="multiples of 16"):
        make_adapter(hv_pipe, H, 24, MSL, num_frames=FRAMES)
