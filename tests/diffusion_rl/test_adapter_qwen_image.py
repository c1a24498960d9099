"""Qwen-Image text-to-image (diffusers' QwenImagePipeline) behind the adapter interface, on a tiny seeded pipeline
saved in the diffusers layout and loaded back as a run loads model.pretrained.

References: diffusers==0.42.1 QwenImagePipeline itself (its __call__ with latents=x_T, and its
`_get_qwen_prompt_embeds` / transformer call / true-CFG norm rescale transcribed from
src/diffusers/pipelines/qwenimage/pipeline_qwenimage.py of that release), and Flow-GRPO's SDE step
(yifan123/flow_grpo@main flow_grpo/diffusers_patch/sd3_sde_with_logprob.py: sde_step_with_logprob) for the
Gaussian densities.
"""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.adapters.qwen_image import QwenImageAdapter
from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

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
@pytest.mark.parametrize("cfg", [1.0])  # true CFG with the norm rescale: the adapter conformance suite
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
