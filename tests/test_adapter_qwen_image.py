"""Qwen-Image text-to-image (diffusers' QwenImagePipeline) behind the adapter interface, on a tiny seeded pipeline
saved in the diffusers layout and loaded back as a run loads model.pretrained.

References: diffusers==0.42.1 QwenImagePipeline itself (its __call__ with latents=x_T, and its
`_get_qwen_prompt_embeds` / transformer call / true-CFG norm rescale transcribed from
src/diffusers/pipelines/qwenimage/pipeline_qwenimage.py of that release), and Flow-GRPO's SDE step
(yifan123/flow_grpo@main flow_grpo/diffusers_patch/sd3_sde_with_logprob.py: sde_step_with_logprob) for the
Gaussian densities.
"""

from __future__ import annotations

import math

import pytest
import torch
from parity_record import record_parity
from tolerances import assert_close_scaled

from diffusion_rl.adapters.qwen_image import QwenImageAdapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.errors import ConfigError

H = W = 32  # latents 4x4 -> 2x2 = 4 packed tokens of 16 channels
PROMPTS = ["a red circle", "two blue squares above a green triangle and a yellow star"]  # unequal lengths: masks


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from mmreward.testing.tiny_qwen_image import save_tiny_qwen_image_pipeline

    return str(save_tiny_qwen_image_pipeline(tmp_path_factory.mktemp("qwen_image") / "pipe", seed=0))


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    from diffusion_rl.pipelines import load_pipeline

    return load_pipeline(qwen_dir)


def _adapter(pipe, **kw):
    from diffusion_rl.pipelines import make_adapter

    return make_adapter(pipe, kw.pop("height", H), kw.pop("width", W), **kw)


def _pipeline_embeds(pipe, prompts):
    """`QwenImagePipeline._get_qwen_prompt_embeds`, transcribed: the template, the last hidden states, the first
    `prompt_template_encode_start_idx` tokens dropped; one prompt at a time, so no padding at all."""
    out = []
    for p in prompts:
        ids = pipe.tokenizer([pipe.prompt_template_encode.format(p)], return_tensors="pt")
        hidden = pipe.text_encoder(input_ids=ids.input_ids, attention_mask=ids.attention_mask,
                                   output_hidden_states=True).hidden_states[-1]
        out.append(hidden[0, pipe.prompt_template_encode_start_idx:])
    return out


@torch.no_grad()
def test_prompt_embeddings_follow_the_pipeline_template(qwen):
    adapter = _adapter(qwen, max_sequence_length=64)
    emb = adapter.encode(PROMPTS)
    pe, mask = emb.tensors["prompt_embeds"], emb.tensors["prompt_embeds_mask"]
    assert pe.shape[:2] == (2, 64) and mask.shape == (2, 64)
    for i, ref in enumerate(_pipeline_embeds(qwen, PROMPTS)):
        n = int(mask[i].sum())
        assert n == ref.shape[0] and bool(mask[i, :n].all())
        assert_close_scaled(pe[i, :n], ref, rel=1e-5)
        assert not pe[i, n:].any()  # zero padding, masked out
    assert emb.tensors["prompt_embeds_mask"][0].sum() < emb.tensors["prompt_embeds_mask"][1].sum()
    # the pipeline cuts the embeddings at max_sequence_length tokens; so do we
    short = _adapter(qwen, max_sequence_length=4).encode(PROMPTS[1:])
    assert short.tensors["prompt_embeds"].shape[1] == 4 and bool(short.tensors["prompt_embeds_mask"].all())


@pytest.mark.parity
@pytest.mark.parametrize("cfg", [1.0, 4.0])
@torch.no_grad()
def test_ode_rollout_equals_the_qwen_image_pipeline(qwen, cfg):
    """Same initial noise and scheduler: our ODE rollout is QwenImagePipeline's sampling, true CFG with the norm
    rescale included (negative prompt ' ', true_cfg_scale = guidance_scale)."""
    adapter = _adapter(qwen)
    assert isinstance(adapter, QwenImageAdapter) and adapter.family == "qwen_image" and not adapter.is_edit
    assert adapter.latent_shape() == (4, 16)
    emb = adapter.encode(PROMPTS)
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=3, guidance_scale=cfg, kernel=Kernel("ode", 0.0))
    true_cfg = {"negative_prompt": [" ", " "], "true_cfg_scale": cfg} if cfg > 1 else {"true_cfg_scale": cfg}
    common = {"prompt": PROMPTS, "num_inference_steps": 3, "height": H, "width": W, **true_cfg}
    x_T = traj.latents[:, 0].clone()
    ref_latents = qwen(latents=x_T.clone(), output_type="latent", **common).images
    ref_images = qwen(latents=x_T.clone(), output_type="pt", **common).images
    assert ref_images.shape == traj.images.shape == (2, 3, H, W)
    record_parity("qwen_image_adapter", original="diffusers==0.42.1 QwenImagePipeline", how="package",
                  actual=traj.latents[:, -1], expected=ref_latents, cases=[f"latents cfg={cfg}"])
    record_parity("qwen_image_adapter", original="diffusers==0.42.1 QwenImagePipeline", how="package",
                  actual=traj.images, expected=ref_images, cases=[f"images cfg={cfg}"])
    assert_close_scaled(traj.latents[:, -1], ref_latents, rel=1e-5)
    torch.testing.assert_close(traj.images, ref_images, atol=2e-6, rtol=0)
    # the condition matters: other prompts, another image from the same noise
    other = rollout(adapter, adapter.encode(PROMPTS[::-1]), [0, 1], [0, 0], num_steps=3, guidance_scale=cfg,
                    kernel=Kernel("ode", 0.0), init_latents=x_T, decode=False)
    assert (other.latents[:, -1] - traj.latents[:, -1]).abs().max() > 1e-3


def _reference_velocity(pipe, x, t, prompts, cfg):
    """One denoiser evaluation as QwenImagePipeline.__call__ makes it (cond, uncond on ' ', norm rescale)."""
    pe, mask = pipe.encode_prompt(prompt=prompts)
    img_shapes = [[(1, H // 16, W // 16)]] * x.shape[0]
    timestep = t.expand(x.shape[0]).to(x.dtype)

    def call(e, m):
        return pipe.transformer(hidden_states=x, timestep=timestep / 1000, guidance=None, encoder_hidden_states_mask=m,
                                encoder_hidden_states=e, img_shapes=img_shapes, return_dict=False)[0]

    cond = call(pe, mask)
    neg, neg_mask = pipe.encode_prompt(prompt=[" "] * x.shape[0])
    uncond = call(neg, neg_mask)
    comb = uncond + cfg * (cond - uncond)
    return comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


@torch.no_grad()
def test_sde_log_probs_are_independent_gaussian_densities(qwen):
    """Flow-GRPO's SDE step, computed here from the pipeline's own velocity: mean and std in float64, the density
    of the sampled next state averaged over the latent elements (the kernels' `reduction="mean"`)."""
    adapter = _adapter(qwen)
    emb = adapter.encode(PROMPTS)
    kernel, cfg, a = Kernel("flow_sde", 0.7), 4.0, 0.7
    traj = rollout(adapter, emb, [0, 1], [0, 1], num_steps=3, guidance_scale=cfg, kernel=kernel, sde_steps=[0, 1],
                   decode=False)
    sigmas = traj.schedule
    for j in range(2):
        x, x_next = traj.latents[:, j], traj.latents[:, j + 1]
        v = _reference_velocity(qwen, x, sigmas.timesteps[j], PROMPTS, cfg).double()
        sigma, sigma_next = float(sigmas.a[j]), float(sigmas.b[j])
        dt = sigma_next - sigma
        std_t = a * math.sqrt(sigma / (1 - (sigma_next if sigma >= 1 else sigma)))  # sigma_1 stands in at sigma = 1
        mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
        expected = torch.distributions.Normal(mean, std_t * math.sqrt(-dt)).log_prob(x_next.double()).mean(dim=(1, 2))
        record_parity("qwen_image_adapter", original="yifan123/flow_grpo sde_step_with_logprob (transcribed)",
                      how="transcribed", actual=traj.log_probs[:, j], expected=expected, cases=[f"sde step {j}"])
        assert_close_scaled(traj.log_probs[:, j].double(), expected, rel=1e-5)
        # the training path (one prompt row at a time, as the trainer caches them) gives the same log-prob
        res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.full((2,), j), traj.schedule, emb, cfg, kernel)
        assert_close_scaled(res.log_prob, traj.log_probs[:, j], rel=1e-6)
    assert (traj.log_probs[:, 2] == 0).all()  # the last step is the ODE


def test_bad_resolutions_and_inputs_are_config_errors(qwen):
    from mmreward.edit import EditPrompt

    with pytest.raises(ConfigError, match="multiples of 16"):
        _adapter(qwen, height=40)
    with pytest.raises(ConfigError, match="multiples of 16"):
        _adapter(qwen, width=24)
    with pytest.raises(ConfigError, match="positive"):
        _adapter(qwen, height=-32)
    with pytest.raises(ConfigError, match="max_sequence_length"):
        _adapter(qwen, max_sequence_length=0)
    with pytest.raises(ConfigError, match="QwenImageEditPipeline"):
        _adapter(qwen).encode([EditPrompt("make it blue", "/nonexistent.png")])


def test_num_frames_for_an_image_pipeline_is_a_config_error(qwen):
    with pytest.raises(ConfigError, match="makes images"):
        _adapter(qwen, num_frames=9)


def test_one_grpo_iteration_trains_the_qwen_image_lora(qwen_dir, tmp_path):
    """model.pretrained is the saved tiny pipeline: loaded, adapted, sampled with true CFG, scored (mock), one
    GRPO update of a LoRA on the transformer's joint-attention projections, exported for load_lora_weights."""
    from diffusers import QwenImagePipeline

    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    cfg = from_dict({
        "model": {"pretrained": qwen_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 8,
                  "max_sequence_length": 32},
        "sample": {"num_steps": 2, "guidance_scale": 4.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 0.5, "kl_beta": 0.01},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(tmp_path), "eval_every": 0, "grid_every": 0, "progress": False},
    })
    trainer = Trainer(cfg)
    assert isinstance(trainer.adapter, QwenImageAdapter)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert trainer.last_images.shape == (4, 3, H, W)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the first ratio is 1 up to float noise
    assert metrics["adv/abs_mean"] > 0 and metrics["train/grad_norm"] > 0
    assert sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable)) > 0
    # the LoRA sits on every joint-attention projection of the transformer (image and text streams)
    layers = QwenImagePipeline.lora_state_dict(str(trainer.export()))
    layers = layers[0] if isinstance(layers, tuple) else layers
    wrapped = {k.split(".lora_A")[0] for k in layers if "lora_A" in k}
    expected = {f"transformer.transformer_blocks.0.attn.{m}" for m in
                ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")}
    assert wrapped == expected, wrapped
    # and loads with load_lora_weights (alpha != rank, read from the export's metadata) into a fresh copy of the pipeline as the trained model
    from diffusion_rl.pipelines import load_pipeline

    def sample(pipe):
        return pipe(PROMPTS, negative_prompt=[" ", " "], true_cfg_scale=4.0, num_inference_steps=2, height=H, width=W,
                    output_type="pt", generator=torch.Generator().manual_seed(7)).images

    trained = sample(trainer.adapter.pipeline)
    base, loaded = load_pipeline(qwen_dir), load_pipeline(qwen_dir)
    loaded.load_lora_weights(str(trainer.export()))
    moved = float((sample(base) - trained).abs().max())
    assert moved > 1e-3, "training did not change the samples; the round trip proves nothing"
    assert_close_scaled(sample(loaded), trained, rel=1e-5, scale=1.0)
