"""Image-editing pipelines in rollouts and training: FluxKontextPipeline with the source image in the condition."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import FluxKontextAdapter, make_adapter, pipeline_family
from diffusion_rl.rollout import rollout
from mmreward.edit import EditPrompt
from mmreward.errors import ConfigError
from mmreward.synthetic.edits import render_edit_targets, sample_edit_tasks, write_edit_dataset
from tests._helpers.qwen_edit_area import small_source_areas


@pytest.fixture(scope="module")
def kontext(clip_tokenizer_dir, tmp_path_factory):
    """Saved in the diffusers layout and loaded back frozen (eval mode), as a run loads model.pretrained."""
    from diffusion_rl.pipelines import load_pipeline
    from mmreward.testing.tiny_models import build_tiny_edit_pipeline

    folder = tmp_path_factory.mktemp("kontext")
    build_tiny_edit_pipeline("flux_kontext", clip_tokenizer_dir, seed=0).save_pretrained(str(folder))
    return load_pipeline(str(folder))


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    from mmreward.prompt_sources import load_prompts

    tasks = sample_edit_tasks(4, seed=0, split="all")
    path = write_edit_dataset(tmp_path_factory.mktemp("edits"), tasks, size=16)
    return tasks, load_prompts(str(path)), path


def test_family_and_adapter(kontext):
    assert pipeline_family(kontext) == "flux_kontext"
    adapter = make_adapter(kontext, 16, 16, max_sequence_length=8)
    assert isinstance(adapter, FluxKontextAdapter) and adapter.is_edit
    with pytest.raises(ConfigError, match="no source image"):
        adapter.encode(["make the circle blue"])


@pytest.mark.parametrize("cfg", [1.0])  # true CFG 2.5: the adapter conformance suite (behaviour 1)
def test_ode_rollout_equals_the_kontext_pipeline(kontext, edits, cfg):
    """Without guidance embeddings (the tiny model) guidance_scale > 1 is true CFG with the empty negative prompt,
    which the pipeline does with negative_prompt='' and true_cfg_scale."""
    from mmreward.edit import load_source_image

    _, prompts, _ = edits
    adapter = make_adapter(kontext, 16, 16, max_sequence_length=8)
    pair = [prompts[0], prompts[1]]
    traj = rollout(adapter, adapter.encode(pair), [0, 1], [0, 0], num_steps=3, guidance_scale=cfg,
                   kernel=Kernel("ode", 0.0))
    sources = torch.stack([load_source_image(p.source) for p in pair])
    true_cfg = {"negative_prompt": ["", ""], "true_cfg_scale": cfg} if cfg > 1 else {}
    ref = kontext(image=sources, prompt=[str(p) for p in pair], num_inference_steps=3, height=16, width=16,
                  max_area=16 * 16, _auto_resize=False, max_sequence_length=8, latents=traj.latents[:, 0].clone(),
                  output_type="pt", **true_cfg).images
    torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    # the source is part of the condition: another source, another edit from the same noise
    swapped = [EditPrompt(str(pair[0]), pair[1].source), EditPrompt(str(pair[1]), pair[0].source)]
    other = rollout(adapter, adapter.encode(swapped), [0, 1], [0, 0], num_steps=3, guidance_scale=cfg,
                    kernel=Kernel("ode", 0.0))
    assert (other.images - traj.images).abs().max() > 1e-4


def test_one_grpo_iteration_with_shapes_edit_eval(kontext, edits, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer
    from mmreward.synthetic.edits import check_edits

    tasks, prompts, path = edits
    cfg = from_dict({
        "model": {"pretrained": "", "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4, "max_sequence_length": 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.5, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 0.5, "kl_beta": 0.01},
        "advantage": {"min_count": 2},
        # mock gives a dense signal on a random tiny model, whose edits all fail the exact checker
        "reward": {"rewards": {"shapes-edit-eval": 1.0, "mock": 1.0}, "options": {"shapes-edit-eval": {"mode": "partial"}}},
        "prompts": {"train": str(path)},
        "log": {"output_dir": str(tmp_path), "eval_every": 0, "grid_every": 0, "progress": False},
    })
    trainer = Trainer(cfg, pipeline=kontext)
    assert isinstance(trainer.adapter, FluxKontextAdapter)
    before = [p.detach().clone() for p in trainer.trainable]
    _, local, _, _ = trainer.local_prompts(0)
    metrics = trainer.train_iteration(0)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the source latents reach the training path too
    assert sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable)) > 0
    # the reward saw each sample's own source image: recompute it with the checker, independently
    by_prompt = {str(p) + p.source: i for i, p in enumerate(prompts)}
    src, _ = render_edit_targets(tasks, size=16)
    sources = torch.stack([src[by_prompt[str(p) + p.source]] for p in local])
    expected = check_edits([str(p) for p in local], sources, trainer.last_images.cpu()).partial
    assert expected.sum() > 0  # some clauses hold, so the comparison has content
    assert metrics["reward/shapes-edit-eval"] == pytest.approx(float(expected.mean()), abs=1e-6)
    # the trained LoRA exports in the layout FluxKontextPipeline.load_lora_weights reads
    from diffusers import FluxKontextPipeline

    layers = FluxKontextPipeline.lora_state_dict(str(trainer.export()))
    layers = layers[0] if isinstance(layers, tuple) else layers
    assert any(k.startswith("transformer.") and "lora_A" in k for k in layers)


# -- Qwen-Image-Edit ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_edit(tmp_path_factory):
    from diffusion_rl.pipelines import load_pipeline
    from mmreward.testing.tiny_models import build_tiny_edit_pipeline

    folder = tmp_path_factory.mktemp("qwen_edit")
    build_tiny_edit_pipeline("qwen_image_edit", None, seed=0).save_pretrained(str(folder))
    return load_pipeline(str(folder))


# at a reduced source area (tests/_helpers/qwen_edit_area.py); at the released 1024x1024 (a VAE encoding of ~3 s
# per source and call, 4096 condition tokens): slow, for the suite's time budget. Check 3's masked-padding
# rounding grows as the condition shrinks (measured max |diff| on the [0, 1] images, no CFG / CFG 2.5: 8.6e-5 /
# 1.5e-4 at the released area, 2.3e-4 / 5.7e-4 at 1/4, 3.4e-4 / 1.1e-3 at 1/16, 1.1e-3 / 2.6e-3 at 1/64), so
# each case runs at the smallest area that keeps it within the 1e-3 bound
@pytest.mark.parametrize(("cfg", "scale"), [(1.0, 16), (2.5, 4), pytest.param(2.5, 1, marks=pytest.mark.slow)],
                         ids=["cfg1", "cfg2.5", "cfg2.5-released-area"])
def test_ode_rollout_equals_the_qwen_image_edit_pipeline(qwen_edit, edits, cfg, scale):
    """Source images go through the VLM prompt and the VAE at about 1024x1024 pixels (divided by `scale`), as the
    pipeline does."""
    with small_source_areas(scale):
        _check_qwen_edit_rollout(qwen_edit, edits, cfg)


def _check_qwen_edit_rollout(qwen_edit, edits, cfg):
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit
    from PIL import Image

    from diffusion_rl.pipelines import QwenImageEditAdapter

    _, prompts, _ = edits
    assert pipeline_family(qwen_edit) == "qwen_image_edit"
    adapter = make_adapter(qwen_edit, 32, 32, max_sequence_length=256)
    assert isinstance(adapter, QwenImageEditAdapter)
    pair = [prompts[0], prompts[1]]
    emb = adapter.encode(pair)
    assert emb.tensors["prompt_embeds"].shape[1] == 256 and not bool(emb.tensors["prompt_embeds_mask"].all())
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=2, guidance_scale=cfg, kernel=Kernel("ode", 0.0))
    images = [Image.open(p.source).convert("RGB") for p in pair]
    t = emb.tensors
    true_cfg = {"negative_prompt": [" ", " "], "true_cfg_scale": cfg} if cfg > 1 else {}
    given = ({"negative_prompt_embeds": t["negative_prompt_embeds"],
              "negative_prompt_embeds_mask": t["negative_prompt_embeds_mask"], "true_cfg_scale": cfg} if cfg > 1 else {})
    common = {"image": images, "num_inference_steps": 2, "height": 32, "width": 32, "output_type": "pt"}
    # 1. the denoising, source latents, CFG and decoding given our (padded) embeddings: with CFG, the adapter
    # conformance suite (TestQwenImageEdit, behaviour 1); without, here
    if cfg == 1.0:
        ref = qwen_edit(prompt_embeds=t["prompt_embeds"], prompt_embeds_mask=t["prompt_embeds_mask"],
                        latents=traj.latents[:, 0].clone(), **given, **common).images
        torch.testing.assert_close(traj.images, ref, atol=2e-6, rtol=0)
    # 2. the embeddings: the pipeline's own encoding of the batch, up to our zero padding (masked out)
    # the pipeline's resize of the (square) sources: 1024x1024 as released, smaller under small_source_areas
    side, _, _ = pipeline_qwenimage_edit.calculate_dimensions(1024 * 1024, 1.0)
    pe, mask = qwen_edit.encode_prompt(prompt=[str(p) for p in pair],
                                       image=[qwen_edit.image_processor.resize(i, side, side) for i in images])
    n = t["prompt_embeds_mask"].sum(1)
    assert n.tolist() == mask.sum(1).tolist()
    for i in range(2):
        torch.testing.assert_close(t["prompt_embeds"][i, : n[i]], pe[i, : n[i]], rtol=0, atol=0)
        assert not t["prompt_embeds"][i, n[i]:].any()
    # 3. end to end with the pipeline's own prompt encoding: the longer (masked) padding only changes the rounding
    # of the masked attention, far below the [0, 1] image scale
    ref = qwen_edit(prompt=[str(p) for p in pair], latents=traj.latents[:, 0].clone(), **true_cfg, **common).images
    torch.testing.assert_close(traj.images, ref, atol=1e-3, rtol=0)
    with pytest.raises(ConfigError, match="no source image"):
        adapter.encode(["make the circle blue"])
    with pytest.raises(ConfigError, match="max_sequence_length"):
        make_adapter(qwen_edit, 32, 32, max_sequence_length=4).encode(pair[:1])


def test_edit_runs_without_edit_records_fail_before_sampling(kontext, edits, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.config_check import check_config
    from diffusion_rl.trainer import Trainer
    from mmreward.edit import check_edit_run

    _, prompts, path = edits
    base = {"model": {"pretrained": "", "height": 16, "width": 16, "max_sequence_length": 8},
            "sample": {"num_steps": 2, "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
            "reward": {"rewards": {"mock": 1.0}}, "prompts": {"train": ["make the circle blue", "add a circle"]},
            "log": {"output_dir": str(tmp_path), "progress": False}}
    # an editing pipeline with text prompts: a config error at construction, naming the prompt
    with pytest.raises(ConfigError, match=r"prompts.train\[0\] = 'make the circle blue' has no source image"):
        Trainer(from_dict(base), pipeline=kontext)
    # an edit reward on text prompts, whatever the pipeline
    with pytest.raises(ConfigError, match=r"\['shapes-edit-eval'\] score edits against their source"):
        check_edit_run("flux", {"train": ["a red circle"]}, ["shapes-edit-eval", "mock"])
    check_edit_run("flux", {"train": ["a red circle"]}, ["mock"])  # text-to-image as before
    check_edit_run("flux_kontext", {"train": list(prompts), "eval": []}, ["shapes-edit-eval"])
    # --check says the same offline, from model_index.json
    folder = tmp_path / "kontext_saved"
    kontext.save_pretrained(str(folder))
    with pytest.raises(ConfigError, match="has no source image"):
        check_config(from_dict({**base, "model": {**base["model"], "pretrained": str(folder)}}))
    ok = check_config(from_dict({**base, "model": {**base["model"], "pretrained": str(folder)},
                                 "prompts": {"train": str(path)}}))
    assert any(line.startswith("model      flux_kontext") for line in ok)
