"""Qwen-Image-2.1 (QwenImage21Adapter) beyond the conformance suite (tests/diffusion_rl/test_adapter_conformance.py): a prompt's
prediction does not depend on the other prompts of the batch, edit records (one or several condition images)
sample what QwenImage21Pipeline(image=[...]) samples and train, the pipeline's configured `sample_sigmas` are the
schedule when their length is the step count, and bad inputs are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusion_rl.pipelines import load_pipeline, make_adapter
from mmreward.errors import ConfigError
from tests._helpers.parity_record import record_parity
from tests._helpers.tolerances import assert_close_scaled

SHORT, LONG = "a cat", "a red circle on the left of a blue square"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from mmreward.testing.tiny_qwen_image21 import save_tiny_qwen_image21_pipeline

    return save_tiny_qwen_image21_pipeline(tmp_path_factory.mktemp("qi21") / "pipe", seed=0)


@pytest.fixture(scope="module")
def pipe(folder):
    return load_pipeline(str(folder))


def _pipeline_way(pipe, prompt: str, x: torch.Tensor, t: float) -> torch.Tensor:
    """The transformer called as QwenImage21Pipeline.__call__ calls it for a one-prompt batch (diffusers 0.42.1:
    encode_prompt, img_mask + one slot per 2x2 target group, timestep / 1000, the last target tokens kept)."""
    pe, mask, pad_mask = pipe.encode_prompt(prompt=[prompt], device="cpu")
    img_mask = torch.cat([pad_mask, pad_mask.new_ones(1, x.shape[1] // 4)], dim=1)
    side = int(x.shape[1] ** 0.5)
    out = pipe.transformer(hidden_states=x, timestep=torch.tensor([t]) / 1000, encoder_hidden_states=pe,
                           encoder_hidden_states_mask=mask, img_shapes=[[(1, side, side)]], img_mask=img_mask,
                           return_dict=False)[0]
    return out[:, -x.shape[1]:]


@torch.no_grad()
def test_each_prompt_is_predicted_as_if_alone_whatever_the_batch(pipe):
    adapter = make_adapter(pipe, 64, 64)
    emb = adapter.encode([LONG, SHORT, LONG])
    lengths = emb.tensors["prompt_embeds_mask"].sum(1).tolist()
    assert lengths[0] == lengths[2] != lengths[1]  # two prompt lengths in one batch
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, *adapter.latent_shape(), generator=gen)
    t = torch.tensor([900.0, 500.0, 200.0])
    out = adapter._forward(adapter.denoiser, x, t, emb, 1.0)
    for i, prompt in enumerate([LONG, SHORT, LONG]):
        ref = _pipeline_way(pipe, prompt, x[i:i + 1], float(t[i]))
        assert_close_scaled(out[i:i + 1], ref, rel=1e-5)
    # why the adapter groups by length: the pipeline's own padded batch moves the shorter prompt's image positions
    pe, mask, pad_mask = pipe.encode_prompt(prompt=[LONG, SHORT], device="cpu")
    img_mask = torch.cat([pad_mask, pad_mask.new_ones(2, x.shape[1] // 4)], dim=1)
    padded = pipe.transformer(hidden_states=x[:2], timestep=t[:2] / 1000, encoder_hidden_states=pe,
                              encoder_hidden_states_mask=mask, img_shapes=[[(1, 4, 4)]] * 2, img_mask=img_mask,
                              return_dict=False)[0][:, -x.shape[1]:]
    alone = _pipeline_way(pipe, SHORT, x[1:2], float(t[1]))
    assert float((padded[1:2] - alone).abs().max()) > 1e-3 * float(alone.abs().max())


def test_schedule_is_the_pipelines_sample_sigmas_when_their_length_is_the_step_count(pipe):
    adapter = make_adapter(pipe, 64, 64)
    pipe.register_to_config(sample_sigmas=[1.0, 0.7, 0.4])
    try:
        # the pipeline's own call with its configured sigmas (num_inference_steps is then ignored, as documented)
        pipe(prompt=SHORT, height=64, width=64, num_inference_steps=9, output_type="latent")
        expected = pipe.scheduler.sigmas.double().clone()
        got = adapter.schedule(3)
        torch.testing.assert_close(got.a, expected[:-1], rtol=0, atol=1e-7)
        torch.testing.assert_close(got.b, expected[1:], rtol=0, atol=1e-7)
        # another step count: linspace(1, 1/N, N), what the pipeline samples when called with those sigmas
        pipe(prompt=SHORT, height=64, width=64, sigmas=list(np.linspace(1.0, 1 / 4, 4)), output_type="latent")
        torch.testing.assert_close(adapter.schedule(4).a, pipe.scheduler.sigmas.double()[:-1], rtol=0, atol=1e-7)
    finally:
        pipe.register_to_config(sample_sigmas=None)


def test_bad_inputs_are_config_errors(pipe, tmp_path):
    from PIL import Image

    from mmreward.edit import EditPrompt

    with pytest.raises(ConfigError, match="multiples of 32"):
        make_adapter(pipe, 48, 64)
    src = tmp_path / "src.png"
    Image.new("RGB", (32, 32)).save(src)
    with pytest.raises(ConfigError, match="mixes edit records"):
        make_adapter(pipe, 64, 64).encode([EditPrompt("make it blue", src), "a cat"])
    with pytest.raises(ConfigError, match="max_sequence_length"):
        make_adapter(pipe, 64, 64, max_sequence_length=4).encode([LONG])
    # another family's setting in the run config is an error, not silently ignored (LTX-2's guidance keys)
    from diffusion_rl.config import ModelConfig
    from diffusion_rl.pipelines import adapter_for_config

    with pytest.raises(ConfigError, match=r"model.stg_scale is an LTX-2 \(LTX2Pipeline\) guidance setting"):
        adapter_for_config(pipe, ModelConfig(pretrained="unused", height=64, width=64, stg_scale=1.0))


def test_family_and_every_lora_target_names_modules_of_the_transformer(pipe):
    from diffusion_rl.adapters import DEFAULT_LORA_TARGETS, adapter_class_for
    from diffusion_rl.adapters.qwen_image21 import (
        QWEN_IMAGE21_LORA_TARGETS,
        QWEN_IMAGE21_MLP_LORA_TARGETS,
        QwenImage21Adapter,
    )

    assert adapter_class_for(pipe) == ("qwen_image21", QwenImage21Adapter)
    assert DEFAULT_LORA_TARGETS["qwen_image21"] == QWEN_IMAGE21_LORA_TARGETS
    names = [n for n, _ in pipe.transformer.named_modules()]
    for target in QWEN_IMAGE21_LORA_TARGETS + QWEN_IMAGE21_MLP_LORA_TARGETS:  # a suffix matching nothing trains less
        assert any(n.endswith("." + target) and n.startswith("transformer_blocks.") for n in names), target
    assert make_adapter(pipe, 64, 64).latent_shape() == (16, pipe.transformer.config.in_channels)  # 64 px / 16


@pytest.fixture(scope="module")
def edits(tmp_path_factory):
    from PIL import Image

    from mmreward.edit import EditPrompt

    root = tmp_path_factory.mktemp("qi21_sources")
    rng = np.random.default_rng(0)
    out = []
    for i, text in enumerate(["make the circle blue", "add a cat"]):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(root / f"src{i}.png")
        out.append(EditPrompt(text, root / f"src{i}.png"))
    return out


@pytest.mark.parity
@torch.no_grad()
def test_edit_records_sample_what_the_pipeline_samples_with_image(pipe, edits):
    """Edit records: the source is the pipeline's condition image (at the output size, the size
    `output_resolution` gives a source of that shape). The ODE rollout's final latents equal
    QwenImage21Pipeline(prompt, image=source, output_resolution=64, use_kv_cache=False) called per prompt from the
    same noise (rel 1e-5; the pipeline takes one image set per call), with true CFG, whose negative prompt " " is
    encoded with the same image; the condition changes the samples."""
    from PIL import Image

    from diffusion_rl.kernels import Kernel
    from diffusion_rl.rollout import rollout

    adapter = make_adapter(pipe, 64, 64)
    traj = rollout(adapter, adapter.encode(edits), [0, 1], [0, 0], num_steps=2, guidance_scale=2.5,
                   kernel=Kernel("ode", 0.0))
    x0 = traj.latents[:, 0]
    ref = torch.cat([pipe(prompt=str(p), image=Image.open(p.source).convert("RGB"), latents=x0[i:i + 1].clone(),
                          height=64, width=64, output_resolution=64, num_inference_steps=2, negative_prompt=" ",
                          true_cfg_scale=2.5, use_kv_cache=False, output_type="latent").images
                     for i, p in enumerate(edits)])
    record_parity("qwen_image21", original="diffusers==0.42.1 QwenImage21Pipeline.__call__ (image=, edits)",
                  how="package", actual=traj.latents[:, -1], expected=ref,
                  cases=["64x64 source and output, 2 steps, true CFG 2.5, use_kv_cache=False"],
                  not_checked="sources of another aspect ratio than the output (a ConfigError)")
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)
    text_only = rollout(adapter, adapter.encode([str(p) for p in edits]), [0, 1], [0, 0], num_steps=2,
                        guidance_scale=2.5, kernel=Kernel("ode", 0.0), decode=False)
    assert float((text_only.latents[:, -1] - ref).abs().max()) > 1e-2 * float(ref.abs().max())


def _pipeline_edit(pipe, prompt, x_T: torch.Tensor, height: int, width: int, resolution: int) -> torch.Tensor:
    """QwenImage21Pipeline.__call__ on one edit record: its sources as the list of condition images (PIL, as a user
    passes them), true CFG 2.5 with the negative prompt " ", 2 steps, uncached forward, the final latents."""
    from PIL import Image

    return pipe(prompt=str(prompt), image=[Image.open(s).convert("RGB") for s in prompt.sources], latents=x_T.clone(),
                height=height, width=width, output_resolution=resolution, num_inference_steps=2, negative_prompt=" ",
                true_cfg_scale=2.5, use_kv_cache=False, output_type="latent").images


@pytest.fixture(scope="module")
def more_sources(tmp_path_factory):
    """Square sources of another size than the output (32 px for a 64 px output), wide (2:1) sources, and a
    square image of another aspect ratio's shape (64x32) for the wrong-size error."""
    from PIL import Image

    root = tmp_path_factory.mktemp("qi21_more")
    rng = np.random.default_rng(1)
    for name, (w, h) in {"sq0": (32, 32), "sq1": (32, 32), "wide0": (48, 24), "wide1": (96, 48), "tall": (32, 64)}.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / f"{name}.png")
    return root


@pytest.mark.parity
@torch.no_grad()
def test_two_image_edit_records_sample_what_the_pipeline_samples(pipe, edits, more_sources):
    """Several condition images per record: every image in the ti2i template ("<imageK><|vision_start|>...", in
    order), VAE tokens of each image before the noisy ones, img_shapes [each grid, target]. The ODE rollout of a batch
    with a 2-image and a 1-image record equals QwenImage21Pipeline(image=[...]) called per record from the same noise
    (rel 1e-5; measured 5.5e-7 on the 2-image row, 0 on the 1-image row); a 2:1 output (R = round(sqrt(H x W)) as
    the pipeline's output_resolution) too (measured 6.3e-7); another second image changes the sample (> 1e-3 of the
    latent scale; measured 3.5e-2)."""
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.rollout import rollout
    from mmreward.edit import EditPrompt

    first, second = (str(p.source) for p in edits)
    two = EditPrompt("put the cat of picture 2 here", first, [first, second])
    one = EditPrompt("make it blue", str(more_sources / "sq0.png"))  # 32 px: resized to 64 as the pipeline does
    adapter = make_adapter(pipe, 64, 64)
    emb = adapter.encode([two, one])
    # the two images' slots (4 each at 64 px) are in the prompt, one block per image
    assert emb.tensors["image_pad_mask"].sum(1).tolist() == [8, 4]
    x_T = torch.randn(1, *adapter.latent_shape(), generator=torch.Generator().manual_seed(3))
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=2, guidance_scale=2.5, kernel=Kernel("ode", 0.0),
                   init_latents=torch.cat([x_T, x_T]), decode=False)
    ref = torch.cat([_pipeline_edit(pipe, p, x_T, 64, 64, 64) for p in (two, one)])
    record_parity("qwen_image21", original="diffusers==0.42.1 QwenImage21Pipeline.__call__ (image=[...], edits)",
                  how="package", actual=traj.latents[:, -1], expected=ref,
                  cases=["a 2-image and a 1-image record in one batch, 64x64, 2 steps, true CFG 2.5, no KV cache"])
    assert_close_scaled(traj.latents[:, -1], ref, rel=1e-5)
    # a different second image: another sample from the same noise
    other = EditPrompt(str(two), first, [first, str(more_sources / "sq1.png")])
    moved = rollout(adapter, adapter.encode([other]), [0], [0], num_steps=2, guidance_scale=2.5,
                    kernel=Kernel("ode", 0.0), init_latents=x_T, decode=False).latents[:, -1]
    assert float((moved - ref[:1]).abs().max()) > 1e-3 * float(ref[:1].abs().max())
    # a 2:1 output, 2:1 sources of two sizes: the pipeline's output_resolution is 45 (calculate_dimensions -> 64x32)
    wide = EditPrompt("swap them", str(more_sources / "wide0.png"),
                      [str(more_sources / "wide0.png"), str(more_sources / "wide1.png")])
    adapter = make_adapter(pipe, 32, 64)
    x_T = torch.randn(1, *adapter.latent_shape(), generator=torch.Generator().manual_seed(4))
    got = rollout(adapter, adapter.encode([wide]), [0], [0], num_steps=2, guidance_scale=2.5,
                  kernel=Kernel("ode", 0.0), init_latents=x_T, decode=False).latents[:, -1]
    ref = _pipeline_edit(pipe, wide, x_T, 32, 64, 45)
    record_parity("qwen_image21", original="diffusers==0.42.1 QwenImage21Pipeline.__call__ (image=[...], edits)",
                  how="package", actual=got, expected=ref, cases=["2 images, 32x64 output, output_resolution=45"])
    assert_close_scaled(got, ref, rel=1e-5)


def test_too_many_wrong_size_and_missing_condition_images_are_config_errors(pipe, edits, more_sources, tmp_path):
    from mmreward.edit import EditPrompt

    first = str(edits[0].source)
    # the images' slots fill the prompt budget: fewer images or a longer model.max_sequence_length
    three = EditPrompt("merge them", first, [first, str(edits[1].source), first])
    n_two = int(make_adapter(pipe, 64, 64).encode([EditPrompt("merge them", first, [first, first])])
                .tensors["prompt_embeds_mask"].sum())
    with pytest.raises(ConfigError, match=r"3 condition image\(s\).*fewer source images or raise "
                                          r"model.max_sequence_length"):
        make_adapter(pipe, 64, 64, max_sequence_length=n_two).encode([three])
    # a source of another aspect ratio than the output: the pipeline would give it another grid
    tall = str(more_sources / "tall.png")
    with pytest.raises(ConfigError, match=r"tall.png' is 32x64.*crop or pad the source images to the output's "
                                          r"aspect ratio 64:64"):
        make_adapter(pipe, 64, 64).encode([EditPrompt("x", first, [first, tall])])
    with pytest.raises(ConfigError, match="gone.png' does not exist; fix the edit record's path"):
        make_adapter(pipe, 64, 64).encode([EditPrompt("x", first, [first, str(tmp_path / "gone.png")])])
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(ConfigError, match="is not a readable image"):
        make_adapter(pipe, 64, 64).encode([EditPrompt("x", str(bad))])
    # 96 px is more than the tiny VLM processor's max_pixels (64 x 64): it reads fewer slots than the latents fill
    with pytest.raises(ConfigError, match=r"read 1 condition image\(s\) of 96x96 as 4 image slots, not 9"):
        make_adapter(pipe, 96, 96).encode([EditPrompt("x", first)])


def test_one_grpo_iteration_on_two_image_edit_records_reproduces_the_rollout_log_probs(folder, edits, tmp_path):
    """Two-image edit records ({"source_images": [...]}, the QwenImageEditPlus record format, read by load_prompts):
    the training path recomputes the rollout's log-probs on them (probe < 1e-5) and moves the LoRA."""
    import json

    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    src_a, src_b = (str(p.source) for p in edits)
    rows = tmp_path / "edits.jsonl"
    rows.write_text(json.dumps({"source_images": [src_a, src_b], "instruction": "put the cat of picture 2 here"}) + "\n"
                    + json.dumps({"source_images": [src_b, src_a], "instruction": "merge the two scenes"}) + "\n")
    cfg = from_dict({
        "model": {"pretrained": str(folder), "height": 64, "width": 64, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 2, "guidance_scale": 2.5, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 1.0},
        "advantage": {"min_count": 2}, "reward": {"rewards": {"mock": 1.0}}, "prompts": {"train": str(rows)},
        "log": {"output_dir": str(tmp_path / "run"), "eval_every": 0, "grid_every": 0, "progress": False},
    })
    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))


def test_run_start_refuses_records_with_more_source_images_than_the_family_takes(edits):
    """`check_source_counts` (run start, through check_reward_modalities): a one-image editing family refuses a
    multi-image record instead of conditioning on its first image; a family that stacks the rows' condition tokens
    refuses a run mixing image counts; Qwen-Image-2.1 pads them and takes both."""
    from diffusion_rl.adapters.flux2 import Flux2Adapter, Flux2KleinAdapter
    from diffusion_rl.adapters.flux_kontext import FluxKontextAdapter
    from diffusion_rl.adapters.qwen_image21 import QwenImage21Adapter
    from diffusion_rl.adapters.qwen_image_edit import QwenImageEditAdapter
    from diffusion_rl.adapters.qwen_image_edit_plus import QwenImageEditPlusAdapter
    from diffusion_rl.pipelines import check_source_counts
    from mmreward.edit import EditPrompt

    first, second = (str(p.source) for p in edits)
    two = EditPrompt("merge them", first, [first, second])
    mixed = {"train": [edits[0], two], "eval": []}
    for cls in (FluxKontextAdapter, QwenImageEditAdapter):  # the classes' own settings (class attributes)
        check_source_counts(cls, {"train": list(edits)})
        with pytest.raises(ConfigError, match=r"prompts.train\[1\] is an edit record with 2 source images.*"
                                              "give one source image per record"):
            check_source_counts(cls, mixed)
    for cls in (QwenImageEditPlusAdapter, Flux2Adapter, Flux2KleinAdapter):
        check_source_counts(cls, {"train": [two, two], "eval": [edits[0]]})  # one count per role
        with pytest.raises(ConfigError, match=r"\[1, 2\] source images.*same number of source images"):
            check_source_counts(cls, mixed)
    check_source_counts(QwenImage21Adapter, mixed)
