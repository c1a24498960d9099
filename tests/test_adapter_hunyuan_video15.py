"""HunyuanVideo 1.5 text-to-video (diffusers' HunyuanVideo15Pipeline) through `diffusion_rl.adapters.hunyuan_video15`,
on a tiny seeded pipeline of the real classes (`mmreward.testing.tiny_hunyuan_video15`).

References: diffusers==0.42.1 HunyuanVideo15Pipeline itself (its __call__ with latents=x_T and its guider), its
transformer call transcribed from src/diffusers/pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py of that
release (noise, zero condition latents and zero mask along channels, zero image_embeds, CFG with the empty prompt),
and Flow-GRPO's SDE step (yifan123/flow_grpo@54809b5 flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:
sde_step_with_logprob) for the Gaussian densities.
"""

from __future__ import annotations

import math

import pytest
import torch
from parity_record import record_parity
from tolerances import assert_close_scaled

from diffusion_rl.adapters.hunyuan_video15 import HV15_LORA_TARGETS, HunyuanVideo15Adapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError

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
@pytest.mark.parametrize("rescale", [0.0, 0.7])
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


def _independent_velocity(pipe, x, t, scale):
    """HunyuanVideo15Pipeline's denoising step transcribed (diffusers==0.42.1 pipeline_hunyuan_video1_5.py __call__):
    [latents, zero condition latents, zero mask] along channels, zero image_embeds of (729, image_embed_dim), the
    conditional and the empty-prompt passes, then uncond + scale (cond - uncond) (ClassifierFreeGuidance.forward)."""
    b = x.shape[0]
    inp = torch.cat([x, torch.zeros_like(x), torch.zeros_like(x[:, :1])], dim=1)
    image_embeds = torch.zeros(b, pipe.vision_num_semantic_tokens, pipe.vision_states_dim)
    preds = []
    for prompts in (PROMPTS, [""] * b):
        pe, mask, pe_2, mask_2 = pipe.encode_prompt(prompt=prompts, device="cpu", dtype=torch.float32, batch_size=b)
        preds.append(pipe.transformer(hidden_states=inp, image_embeds=image_embeds, timestep=t.expand(b),
                                      encoder_hidden_states=pe, encoder_attention_mask=mask,
                                      encoder_hidden_states_2=pe_2, encoder_attention_mask_2=mask_2,
                                      return_dict=False)[0])
    cond, uncond = preds
    return uncond + scale * (cond - uncond)


def test_sde_log_probs_are_flow_grpo_gaussian_densities(pipe):
    _guider(pipe, 4.0)
    adapter = HunyuanVideo15Adapter(pipe, H, W, MSL, FRAMES)
    emb = adapter.encode(PROMPTS)
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=STEPS, guidance_scale=4.0, kernel=Kernel("flow_sde", 0.7),
                   sde_steps=[0, 1], decode=False)
    sigmas = traj.schedule.a.tolist() + [float(traj.schedule.b[-1])]
    with torch.no_grad():
        for j in range(2):
            x, t = traj.latents[:, j], traj.schedule.timesteps[j]
            v = _independent_velocity(pipe, x, t, 4.0).double()
            # Flow-GRPO sde_step_with_logprob: std_t = a sqrt(sigma / (1 - sigma)) (sigma = 1 uses sigmas[1])
            sigma, sigma_next = sigmas[j], sigmas[j + 1]
            dt = sigma_next - sigma
            std_t = 0.7 * math.sqrt(sigma / (1 - (sigmas[1] if sigma == 1 else sigma)))
            mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
            density = torch.distributions.Normal(mean, std_t * math.sqrt(-dt)).log_prob(traj.latents[:, j + 1].double())
            expected = density.mean(dim=(1, 2, 3, 4))  # our kernels average over latent elements
            record_parity("hunyuan_video15", original="yifan123/flow_grpo@54809b5 sde_step_with_logprob",
                          how="transcribed", actual=traj.log_probs[:, j], expected=expected,
                          cases=(f"Flow-SDE 0.7 log-prob, step {j}",))
            assert_close_scaled(traj.log_probs[:, j].double(), expected, rel=1e-4)
    assert (traj.log_probs[:, 2] == 0).all()  # an ODE step outside sde_steps
    # the training path recomputes the same log-probs from the stored states
    res = step_log_prob(adapter, adapter.denoiser, traj.latents[:, 1], traj.latents[:, 2], torch.tensor([1, 1]),
                        traj.schedule, emb, 4.0, Kernel("flow_sde", 0.7))
    assert_close_scaled(res.log_prob, traj.log_probs[:, 1], rel=1e-5)


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


def _run_cfg(pipe_dir: str, out, prompts) -> dict:
    return {
        "model": {"pretrained": pipe_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": MSL, "num_frames": FRAMES},
        "sample": {"num_steps": STEPS, "guidance_scale": 4.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 1.0},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": prompts},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


def test_one_grpo_iteration_from_the_saved_folder_trains_the_attention_lora(tmp_path_factory, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer
    from mmreward.testing.tiny_hunyuan_video15 import save_tiny_hunyuan_video15

    pipe_dir = str(save_tiny_hunyuan_video15(tmp_path_factory.mktemp("hv15") / "pipe"))
    cfg = _run_cfg(pipe_dir, tmp_path, PROMPTS)
    trainer = Trainer(from_dict(cfg))
    assert isinstance(trainer.adapter, HunyuanVideo15Adapter)
    names = {id(p): n for n, p in trainer.adapter.denoiser.named_parameters()}
    trained = [names[id(p)] for p in trainer.trainable]
    assert trained and all("lora_" in n for n in trained)
    # every attention projection of the dual-stream blocks and of the token refiner, and nothing else
    wrapped = {n.split(".lora_")[0] for n in trained}
    suffixes = {next(s for s in HV15_LORA_TARGETS if w.endswith("." + s)) for w in wrapped}
    assert suffixes == set(HV15_LORA_TARGETS)
    assert any(w.startswith("transformer_blocks.") for w in wrapped)
    assert any(w.startswith("context_embedder.") for w in wrapped)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert trainer.last_images.shape == (4, FRAMES, 3, H, W)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # rollout and training paths agree before the update
    changed = [names[id(p)] for a, p in zip(before, trainer.trainable) if not torch.equal(a, p.detach())]
    assert any("transformer_blocks." in n for n in changed)


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


def test_i2v_needs_first_frames_and_trains_from_jsonl_rows(i2v, first_frame, tmp_path_factory, tmp_path):
    import json

    from diffusion_rl.adapters.hunyuan_video15 import HunyuanVideo15I2VAdapter
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer
    from mmreward.testing.tiny_hunyuan_video15 import save_tiny_hunyuan_video15

    with pytest.raises(ConfigError, match="has no source image"):
        HunyuanVideo15I2VAdapter(i2v, H, W, MSL, FRAMES).encode(PROMPTS)
    root = tmp_path_factory.mktemp("hv15_i2v")
    pipe_dir = str(save_tiny_hunyuan_video15(root / "pipe", kind="i2v"))
    rows = root / "first_frames.jsonl"
    rows.write_text("".join(json.dumps({"source_image": str(first_frame[1][0].source), "instruction": p}) + "\n"
                            for p in PROMPTS))
    cfg = _run_cfg(pipe_dir, tmp_path, str(rows))
    trainer = Trainer(from_dict(cfg))
    assert isinstance(trainer.adapter, HunyuanVideo15I2VAdapter) and trainer.adapter.family == "hunyuan_video15_i2v"
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert trainer.last_images.shape == (4, FRAMES, 3, H, W)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the first-frame condition reaches the training path
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))


def test_lora_export_without_a_pipeline_lora_loader_reloads_into_the_transformer(tmp_path_factory, tmp_path):
    """HunyuanVideo15Pipeline has no save/load_lora_weights in diffusers 0.42: the export is the transformer's PEFT
    adapter file, and `transformer.load_lora_adapter` on a fresh pipeline reproduces the trained denoiser."""
    from diffusers import HunyuanVideo15Pipeline

    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer
    from mmreward.testing.tiny_hunyuan_video15 import save_tiny_hunyuan_video15

    pipe_dir = str(save_tiny_hunyuan_video15(tmp_path_factory.mktemp("hv15x") / "pipe"))
    cfg = _run_cfg(pipe_dir, tmp_path / "run", PROMPTS)
    cfg["model"]["lora_alpha"] = 8  # alpha != rank: the scaling must travel in the file
    trainer = Trainer(from_dict(cfg))
    trainer.train_iteration(0)
    out = trainer.export(tmp_path / "final")
    fresh = HunyuanVideo15Pipeline.from_pretrained(pipe_dir)
    fresh.transformer.load_lora_adapter(str(out), prefix=None, adapter_name="default",
                                        weight_name="pytorch_lora_weights.safetensors")
    trained = trainer.adapter.denoiser
    x = torch.randn(1, *trainer.adapter.latent_shape(), generator=torch.Generator().manual_seed(0))
    embeds = trainer.embeds_for(PROMPTS[:1])
    t = torch.tensor([500.0])
    with torch.no_grad():
        want = trainer.adapter._forward(trained, x, t, embeds, 1.0)
        got = trainer.adapter._forward(fresh.transformer, x, t, embeds, 1.0)
        base = trainer.adapter._forward(HunyuanVideo15Pipeline.from_pretrained(pipe_dir).transformer, x, t, embeds, 1.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    assert float((base - want).abs().max()) > 1e-4  # the update is visible, so the comparison means something
