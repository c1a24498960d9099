"""Qwen-Image-Edit-2509/2511 (diffusers' QwenImageEditPlusPipeline, multi-image edits) behind the adapter interface,
on a tiny seeded pipeline saved in the diffusers layout and loaded back as a run loads model.pretrained.

References: diffusers==0.42.1 QwenImageEditPlusPipeline itself (its __call__ with image=[...] and latents=x_T; its
prompt embeddings read from inside __call__ through callback_on_step_end; its transformer call, img_shapes and
true-CFG norm rescale transcribed from src/diffusers/pipelines/qwenimage/pipeline_qwenimage_edit_plus.py of that
release), and Flow-GRPO's SDE step (yifan123/flow_grpo@main flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:
sde_step_with_logprob) for the Gaussian densities.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.rollout import rollout, step_log_prob
from mmreward.edit import EditPrompt
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.qwen_edit_area import SMALL_AREA_SCALE, small_source_areas
from tests._helpers.tolerances import assert_close_scaled

H = W = 32  # latents 4x4 -> 4 packed noisy tokens; the condition images add 64 tokens each at the default
# suite's source areas (tests/_helpers/qwen_edit_area.py: 1/64 of the released ones), 4096 at the released 1024x1024
MAX_LEN = 256  # template + two images' vision tokens (the tiny processor's) + instruction fit
ORIGINAL = "diffusers==0.42.1 QwenImageEditPlusPipeline"


@pytest.fixture(scope="module")
def plus_dir(tmp_path_factory):
    from mmreward.testing.tiny_qwen_image_edit_plus import save_tiny_qwen_image_edit_plus_pipeline

    return str(save_tiny_qwen_image_edit_plus_pipeline(tmp_path_factory.mktemp("qwen_edit_plus") / "pipe", seed=0))


@pytest.fixture(scope="module")
def plus(plus_dir):
    from diffusion_rl.pipelines import load_pipeline

    return load_pipeline(plus_dir)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Edit records from ShapesWorld sources: multi-image rows ({"source_images": [...]}, one square and one wide
    image, so the two condition grids differ) and a one-image row, read through load_prompts."""
    from PIL import Image

    from mmreward.prompt_sources import load_prompts
    from mmreward.synthetic.edits import sample_edit_tasks, write_edit_dataset

    folder = tmp_path_factory.mktemp("plus_edits")
    write_edit_dataset(folder, sample_edit_tasks(4, seed=0, split="all"), size=16)
    Image.open(folder / "sources/00003.png").convert("RGB").resize((24, 16)).save(folder / "wide.png")
    rows = [{"source_images": ["sources/00000.png", "wide.png"], "instruction": "put the circle of picture 2 here"},
            {"source_image": "sources/00001.png", "instruction": "make the square blue"},
            {"source_images": ["sources/00002.png", "sources/00000.png"], "instruction": "merge the two scenes"},
            {"source_images": ["sources/00001.png", "sources/00002.png"], "instruction": "swap the colours"}]
    path = folder / "plus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return load_prompts(str(path)), folder, path


def _adapter(pipe, **kw):
    from diffusion_rl.pipelines import make_adapter

    return make_adapter(pipe, H, W, max_sequence_length=kw.pop("max_sequence_length", MAX_LEN), **kw)


def _pil(prompt: EditPrompt):
    from PIL import Image

    return [Image.open(s).convert("RGB") for s in prompt.sources]


def test_edit_records_carry_every_source(records):
    prompts, folder, _ = records
    assert len(prompts[0].sources) == 2 and prompts[0].source == prompts[0].sources[0]
    assert prompts[0].sources[1] == str((folder / "wide.png").resolve())
    assert prompts[1].sources == (prompts[1].source,)  # one-image records unchanged
    meta = prompts.metadata[0]  # rewards see the first source as source_image, and all of them
    assert meta["source_image"] == prompts[0].source and meta["source_images"] == list(prompts[0].sources)
    assert "source_images" not in prompts.metadata[1]
    # the sources are the prompt's identity (trainer caches), order included
    swapped = EditPrompt(str(prompts[0]), prompts[0].sources[1], prompts[0].sources[::-1])
    assert swapped != prompts[0] and hash(swapped) != hash(prompts[0])
    import pickle

    assert pickle.loads(pickle.dumps(prompts[0])).sources == prompts[0].sources


@pytest.mark.parity
# 2 images with and without CFG at 1/64 of the released source areas; at the released areas (a 1024x1024 VAE
# encoding per image and call, 4096 condition tokens per image): slow, for the suite's time budget
# 1 image with CFG (given our embeddings): the adapter conformance suite; its own-encoding check is the 2-image one's
@pytest.mark.parametrize(("row", "cfg", "scale"), [(0, 1.0, SMALL_AREA_SCALE), (0, 2.5, SMALL_AREA_SCALE),
                                                   pytest.param(0, 2.5, 1, marks=pytest.mark.slow)],
                         ids=["2img-cfg1", "2img-cfg2.5", "2img-cfg2.5-released-area"])
@torch.no_grad()
def test_ode_rollout_equals_the_edit_plus_pipeline(plus, records, row, cfg, scale):
    """Same x_T and scheduler: our ODE rollout is QwenImageEditPlusPipeline's sampling for 1 and 2 condition images
    (the pipeline samples one prompt per call)."""
    with small_source_areas(scale):
        _check_ode_rollout(plus, records, row, cfg)


def _check_ode_rollout(plus, records, row, cfg):
    from diffusion_rl.adapters.qwen_image_edit_plus import QwenImageEditPlusAdapter

    prompts, _, _ = records
    p = prompts[row]
    adapter = _adapter(plus)
    assert isinstance(adapter, QwenImageEditPlusAdapter) and adapter.family == "qwen_image_edit_plus"
    emb = adapter.encode([p])
    t = emb.tensors
    traj = rollout(adapter, emb, [0], [0], num_steps=2, guidance_scale=cfg, kernel=Kernel("ode", 0.0))
    x_T = traj.latents[:, 0].clone()
    common = {"image": _pil(p), "num_inference_steps": 2, "height": H, "width": W, "output_type": "pt"}
    given = ({"negative_prompt_embeds": t["negative_prompt_embeds"],
              "negative_prompt_embeds_mask": t["negative_prompt_embeds_mask"], "true_cfg_scale": cfg}
             if cfg > 1 else {"true_cfg_scale": cfg})
    # 1. denoising, condition latents (the pipeline VAE-encodes the images itself), img_shapes, CFG, decoding:
    # exactly the pipeline's, given our (padded) prompt embeddings
    ref = plus(prompt_embeds=t["prompt_embeds"], prompt_embeds_mask=t["prompt_embeds_mask"], latents=x_T.clone(),
               **given, **common).images
    case = f"{len(p.sources)} image(s) cfg={cfg}"
    record_parity("qwen_image_edit_plus", original=ORIGINAL, how="package", actual=traj.images, expected=ref,
                  cases=[f"images, given our embeddings, {case}"])
    assert ref.shape == traj.images.shape == (1, 3, H, W)
    torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    # 2. the prompt embeddings: the pipeline's own, read inside its __call__, up to our zero padding
    seen = {}

    def grab(pipe, i, ts, kw):
        seen.setdefault("pe", kw["prompt_embeds"].clone())
        return {}

    true_cfg = {"negative_prompt": " ", "true_cfg_scale": cfg} if cfg > 1 else {"true_cfg_scale": cfg}
    ref_own = plus(prompt=str(p), latents=x_T.clone(), callback_on_step_end=grab,
                   callback_on_step_end_tensor_inputs=["prompt_embeds"], **true_cfg, **common).images
    n = int(t["prompt_embeds_mask"].sum())
    assert n == seen["pe"].shape[1]
    torch.testing.assert_close(t["prompt_embeds"][0, :n], seen["pe"][0], rtol=0, atol=0)
    assert not t["prompt_embeds"][0, n:].any()
    # 3. end to end with the pipeline's own encoding: the masked padding only changes attention rounding
    # (measured 3e-7 to 4.2e-7 on the [0, 1] image scale; the bound leaves room for other CPUs' kernels)
    record_parity("qwen_image_edit_plus", original=ORIGINAL, how="package", actual=traj.images, expected=ref_own,
                  cases=[f"images, pipeline's own prompt encoding, {case}"])
    torch.testing.assert_close(traj.images, ref_own, atol=1e-4, rtol=0)
    if len(p.sources) == 2 and cfg > 1:
        # each image's vision tokens are in the condition: one image fewer, a shorter prompt
        assert int(adapter.encode([EditPrompt(str(p), p.source)]).tensors["prompt_embeds_mask"].sum()) < n
        # the order of the images is part of the condition ("Picture 1", "Picture 2"; the latents' order)
        q = EditPrompt(str(p), p.sources[1], p.sources[::-1])
        other = rollout(adapter, adapter.encode([q]), [0], [0], num_steps=2, guidance_scale=cfg,
                        kernel=Kernel("ode", 0.0), init_latents=x_T, decode=False)
        assert (other.latents[:, -1] - traj.latents[:, -1]).abs().max() > 1e-4


@torch.no_grad()
def _reference_velocity(pipe, x, t, prompt: EditPrompt, cfg):
    """One denoiser evaluation as QwenImageEditPlusPipeline.__call__ makes it (transcribed): condition images at
    384x384 area for the VLM, VAE images at 1024x1024 area, latents packed and concatenated in order, img_shapes
    [noisy grid, *condition grids], cond and uncond (' ') predictions cut to the noisy tokens, norm rescale."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as module

    cond_imgs, lat, shapes = [], [], [(1, H // 16, W // 16)]
    for img in _pil(prompt):
        # the module's areas (384x384 and 1024x1024 as released; smaller under small_source_areas)
        cw, ch = module.calculate_dimensions(module.CONDITION_IMAGE_SIZE, img.size[0] / img.size[1])
        vw, vh = module.calculate_dimensions(module.VAE_IMAGE_SIZE, img.size[0] / img.size[1])
        cond_imgs.append(pipe.image_processor.resize(img, ch, cw))
        z = pipe._encode_vae_image(pipe.image_processor.preprocess(img, vh, vw).unsqueeze(2), generator=None)
        lat.append(pipe._pack_latents(z, 1, z.shape[1], z.shape[3], z.shape[4]))
        shapes.append((1, vh // 16, vw // 16))
    b = x.shape[0]
    hidden = torch.cat([x, torch.cat(lat, 1).expand(b, -1, -1)], 1)

    def call(text):
        e, m = pipe.encode_prompt(prompt=[text], image=cond_imgs)  # m is None when nothing is padded
        out = pipe.transformer(hidden_states=hidden, timestep=t.expand(b).to(x.dtype) / 1000, guidance=None,
                               encoder_hidden_states_mask=None if m is None else m.expand(b, -1), encoder_hidden_states=e.expand(b, -1, -1),
                               img_shapes=[shapes] * b, return_dict=False)[0]
        return out[:, : x.shape[1]]

    cond, uncond = call(str(prompt)), call(" ")
    comb = uncond + cfg * (cond - uncond)
    return comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


@torch.no_grad()
@small_source_areas()
def test_sde_log_probs_are_independent_gaussian_densities(plus, records):
    """Flow-GRPO's SDE step from the pipeline's own velocity (two condition images): mean and std in float64, the
    density of the sampled next state averaged over the latent elements (the kernels' reduction="mean")."""
    prompts, _, _ = records
    p = prompts[0]
    adapter = _adapter(plus)
    emb = adapter.encode([p]).expand(2)
    kernel, cfg, a = Kernel("flow_sde", 0.7), 2.5, 0.7
    traj = rollout(adapter, emb, [0, 0], [0, 1], num_steps=2, guidance_scale=cfg, kernel=kernel, sde_steps=[0],
                   decode=False)
    sig = traj.schedule
    x, x_next = traj.latents[:, 0], traj.latents[:, 1]
    v = _reference_velocity(plus, x, sig.timesteps[0], p, cfg).double()
    sigma, sigma_next = float(sig.a[0]), float(sig.b[0])
    dt = sigma_next - sigma
    std_t = a * math.sqrt(sigma / (1 - (sigma_next if sigma >= 1 else sigma)))  # sigma_1 stands in at sigma = 1
    mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    expected = torch.distributions.Normal(mean, std_t * math.sqrt(-dt)).log_prob(x_next.double()).mean(dim=(1, 2))
    record_parity("qwen_image_edit_plus", original="yifan123/flow_grpo@main sde_step_with_logprob (transcribed)",
                  how="transcribed", actual=traj.log_probs[:, 0], expected=expected, cases=["sde step 0, 2 images"])
    assert_close_scaled(traj.log_probs[:, 0].double(), expected, rel=1e-5)
    res = step_log_prob(adapter, adapter.denoiser, x, x_next, torch.zeros(2, dtype=torch.long), sig, emb, cfg, kernel)
    assert_close_scaled(res.log_prob, traj.log_probs[:, 0], rel=1e-6)
    assert (traj.log_probs[:, 1] == 0).all()  # the last step is the ODE


@small_source_areas()
def test_missing_and_bad_source_images_are_config_errors(plus, records, tmp_path):
    from mmreward.edit import check_edit_run
    from mmreward.prompt_sources import load_prompts

    prompts, folder, _ = records
    adapter = _adapter(plus)
    with pytest.raises(ConfigError, match="no source image"):
        adapter.encode(["make the circle blue"])
    with pytest.raises(ConfigError, match="does not exist"):
        adapter.encode([EditPrompt("x", prompts[1].source, [prompts[1].source, str(tmp_path / "gone.png")])])
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(ConfigError, match="not a readable image"):
        adapter.encode([EditPrompt("x", str(bad))])
    with pytest.raises(ConfigError, match="different numbers or sizes"):
        adapter.encode([prompts[0], prompts[1]])
    with pytest.raises(ConfigError, match="has no source image"):
        check_edit_run("qwen_image_edit_plus", {"train": ["make it blue"]}, ["mock"])
    for row, match in [({"source_images": ["sources/00000.png", "nope.png"], "instruction": "a"}, "does not exist"),
                       ({"source_images": "sources/00000.png", "instruction": "a"}, "non-empty list"),
                       ({"source_images": [], "instruction": "a"}, "non-empty list"),
                       ({"source_images": ["sources/00000.png", 3], "instruction": "a"}, "path string"),
                       ({"source_images": ["sources/00000.png"], "source_image": "sources/00000.png",
                         "instruction": "a"}, "not both")]:
        path = folder / "bad.jsonl"
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(ConfigError, match=match):
            load_prompts(str(path))


@pytest.mark.slow  # the adapter conformance suite runs one GRPO iteration of this family in the default run
def test_one_grpo_iteration_trains_the_edit_plus_lora(plus_dir, records, tmp_path):
    """model.pretrained is the saved tiny pipeline; the prompts are two-image edit records: sampled with true CFG,
    scored (mock), one GRPO update of a LoRA on the joint-attention projections, exported for load_lora_weights."""
    from diffusers import QwenImageEditPlusPipeline

    from diffusion_rl.adapters.qwen_image_edit_plus import QwenImageEditPlusAdapter
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    _, folder, _ = records
    rows = [{"source_images": ["sources/00002.png", "sources/00000.png"], "instruction": "merge the two scenes"},
            {"source_images": ["sources/00001.png", "sources/00002.png"], "instruction": "swap the colours"}]
    path = folder / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = from_dict({
        "model": {"pretrained": plus_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 8,
                  "max_sequence_length": MAX_LEN},
        "sample": {"num_steps": 2, "guidance_scale": 2.5, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 0.5, "kl_beta": 0.01},
        "advantage": {"min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": str(path)},
        "log": {"output_dir": str(tmp_path), "eval_every": 0, "grid_every": 0, "progress": False},
    })
    trainer = Trainer(cfg)
    assert isinstance(trainer.adapter, QwenImageEditPlusAdapter)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert trainer.last_images.shape == (4, 3, H, W)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the condition latents reach the training path too
    assert metrics["adv/abs_mean"] > 0 and metrics["train/grad_norm"] > 0
    assert sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable)) > 0
    layers = QwenImageEditPlusPipeline.lora_state_dict(str(trainer.export()))
    layers = layers[0] if isinstance(layers, tuple) else layers
    wrapped = {k.split(".lora_A")[0] for k in layers if "lora_A" in k}
    expected = {f"transformer.transformer_blocks.0.attn.{m}" for m in
                ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")}
    assert wrapped == expected, wrapped
