"""HunyuanVideo 1.5 text-to-video (diffusers' HunyuanVideo15Pipeline) through `diffusion_rl.adapters.hunyuan_video15`,
on a tiny seeded pipeline of the real classes (`mmreward.testing.tiny_hunyuan_video15`).

References: diffusers==0.42.1 HunyuanVideo15Pipeline itself (its __call__ with latents=x_T and its guider), its
transformer call transcribed from src/diffusers/pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py of that
release (noise, zero condition latents and zero mask along channels, zero image_embeds, CFG with the empty prompt),
and Flow-GRPO's SDE step (yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:
sde_step_with_logprob) for the Gaussian densities.
"""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.adapters.hunyuan_video15 import HV15_LORA_TARGETS, HunyuanVideo15Adapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

H = W = 16  # the tiny VAE's spatial factor is 4: 4x4 latents
FRAMES = 5  # temporal factor 2: (5 - 1) / 2 + 1 = 3 latent frames
MSL = 24  # Qwen2.5-VL tokens after the template (the pipeline's tokenizer_max_length, 1000 when released)
STEPS = 3
# the second prompt quotes text, so the ByT5 glyph branch runs for it and not for the first (zero embeds, zero mask)
PROMPTS = ["a red circle moving left", 'a shop sign that says "OPEN" at night']


@pytest.fixture(scope="module")
def pipe():
    from mmreward.testing.tiny_hunyuan_video15 import build_tiny_hunyuan_video15

    p = build_tiny_hunyuan_video15(seed=0)
    p.set_progress_bar_config(disable=True)
    p.tokenizer_max_length = MSL  # the reference pipeline reads this attribute; the adapter takes max_sequence_length
    return p


def _guider(pipe, scale: float, rescale: float = 0.0):
    from diffusers.guiders import ClassifierFreeGuidance

    pipe.guider = ClassifierFreeGuidance(guidance_scale=scale, guidance_rescale=rescale)


@pytest.mark.parity
@pytest.mark.parametrize("rescale", [0.7])  # rescale 0 (plain CFG 6): the adapter conformance suite
def test_ode_rollout_equals_hunyuan_video15_pipeline(pipe, rescale):
    _guider(pipe, 6.0, rescale)
    adapter = HunyuanVideo15Adapter(pipe, H, W, MSL, FRAMES)
    assert adapter.latent_shape() == (4, 3, 4, 4)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=STEPS, guidance_scale=6.0,
                   kernel=Kernel("ode", 0.0))
    kw = {"num_inference_steps": STEPS, "height": H, "width": W, "num_frames": FRAMES}
    ref = pipe(PROMPTS, output_type="latent", latents=traj.latents[:, 0].clone(), **kw).frames
    max_abs, max_rel = record_parity(
        "hunyuan_video15", original="diffusers==0.42.1 HunyuanVideo15Pipeline", how="package",
        actual=traj.latents[:, -1], expected=ref, cases=(f"video, CFG 6, guidance_rescale={rescale}, glyph text",))
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)  # float32, same ops in the same order up to CFG's sum
    # the pipeline's VAE decode fails for batch > 1 (diffusers 0.42 causal-attention mask), so one clip per call
    video = torch.cat([pipe(PROMPTS[i], output_type="pt", latents=traj.latents[i:i + 1, 0].clone(), **kw).frames
                       for i in range(2)])
    assert traj.images.shape == video.shape == (2, FRAMES, 3, H, W)
    assert_close_scaled(traj.images, video, rel=1e-4)
    # guidance matters: without it the latents differ, so the comparison above exercised the CFG branch
    plain = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=STEPS, guidance_scale=1.0,
                    kernel=Kernel("ode", 0.0), decode=False)
    assert (plain.latents[:, -1] - ref).abs().max() > 1e-3 * ref.abs().max()


def test_registered_and_bad_geometry_is_config_error(pipe):
    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, VIDEO_FAMILIES
    from diffusion_rl.pipelines import make_adapter

    adapter = make_adapter(pipe, H, W, MSL, FRAMES)
    assert type(adapter) is HunyuanVideo15Adapter and adapter.family == "hunyuan_video15"
    assert DEFAULT_LORA_TARGETS["hunyuan_video15"] == HV15_LORA_TARGETS and "hunyuan_video15" in VIDEO_FAMILIES
    # defaults follow the pipeline: 121 frames, the target-size bucket nearest 16:9 (here 16 px: 12x20)
    default = HunyuanVideo15Adapter(pipe)
    assert default.num_frames == 121
    assert (default.height, default.width) == pipe.video_processor.calculate_default_height_width(9, 16, 16)
    with pytest.raises(ConfigError, match=r"num_frames - 1 must be a multiple of 2 \(e.g. 5 or 7\)"):
        HunyuanVideo15Adapter(pipe, H, W, MSL, num_frames=6)
    with pytest.raises(ConfigError, match="multiples of 4"):
        HunyuanVideo15Adapter(pipe, 18, W, MSL, FRAMES)
    with pytest.raises(ConfigError, match="both height and width"):
        HunyuanVideo15Adapter(pipe, H, None, MSL, FRAMES)
    with pytest.raises(ConfigError, match=r"expected \(B, C, T', H', W'\)"):
        adapter.decode(torch.zeros(1, 4, 4, 4))
    from diffusers.guiders import ClassifierFreeGuidance

    pipe.guider = ClassifierFreeGuidance(guidance_scale=6.0, start=0.2)
    try:
        with pytest.raises(ConfigError, match="start=0.0, stop=1.0"):
            HunyuanVideo15Adapter(pipe, H, W, MSL, FRAMES)
    finally:
        _guider(pipe, 6.0)


# -- image-to-video ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def first_frame(tmp_path_factory):
    import numpy as np
    from PIL import Image

    from mmreward.edit import EditPrompt

    path = tmp_path_factory.mktemp("hv15_frames") / "frame.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path)  # cropped to 16x16 by the pipeline
    return Image.open(path).convert("RGB"), [EditPrompt(p, path) for p in PROMPTS]


@pytest.fixture(scope="module")
def i2v():
    from mmreward.testing.tiny_hunyuan_video15 import build_tiny_hunyuan_video15

    p = build_tiny_hunyuan_video15(seed=0, guidance_scale=5.0, kind="i2v")
    p.set_progress_bar_config(disable=True)
    p.tokenizer_max_length = MSL
    return p


@pytest.mark.parity
def test_i2v_ode_rollout_equals_hunyuan_video15_image_to_video_pipeline(i2v, first_frame):
    from diffusion_rl.adapters.hunyuan_video15 import HunyuanVideo15I2VAdapter

    image, prompts = first_frame
    # the pipeline sizes the video from the image (its target-size bucket): 16x16 for a square image here
    assert i2v.video_processor.calculate_default_height_width(20, 20, 16) == (H, W)
    adapter = HunyuanVideo15I2VAdapter(i2v, H, W, MSL, FRAMES)
    emb = adapter.encode(prompts)
    assert emb.tensors["cond_latents"].shape == (2, 4, 3, 4, 4) and emb.tensors["image_embeds"].shape == (2, 16, 12)
    assert (emb.tensors["cond_latents"][:, :, 1:] == 0).all() and emb.tensors["cond_latents"][:, :, 0].abs().max() > 0
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=STEPS, guidance_scale=5.0, kernel=Kernel("ode", 0.0))
    ref = i2v(image=image, prompt=PROMPTS, output_type="latent", latents=traj.latents[:, 0].clone(),
              num_inference_steps=STEPS, num_frames=FRAMES).frames
    record_parity("hunyuan_video15", original="diffusers==0.42.1 HunyuanVideo15ImageToVideoPipeline", how="package",
                  actual=traj.latents[:, -1], expected=ref, cases=("image-to-video, first frame 20x20 -> 16x16, CFG 5",))
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)
    # the first frame matters: another image gives another video
    other = emb.tensors["cond_latents"].clone()
    other[:, :, 0] = -other[:, :, 0]
    emb2 = type(emb)({**emb.tensors, "cond_latents": other})
    moved = rollout(adapter, emb2, [0, 1], [0, 0], num_steps=STEPS, guidance_scale=5.0, kernel=Kernel("ode", 0.0),
                    decode=False)
    assert (moved.latents[:, -1] - ref).abs().max() > 1e-3 * ref.abs().max()
