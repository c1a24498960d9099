"""The differentiable noise->image map against the pipelines' own sampling, best-of-N selection and its
order-statistics curve against brute force over subsets, and noise exploration + ReNO."""

from __future__ import annotations

import itertools

import pytest
import torch

from diffusion_rl.inference import (
    NoiseToImage,
    RenoConfig,
    RewardObjective,
    best_of_n,
    best_of_n_curve,
    explore_then_optimize,
    parse_weighted,
)
from diffusion_rl.inference.best_of_n import sample_seeds
from mmreward.errors import ConfigError, RewardInputError
from tests._helpers.inference_fixtures import mock_objective, one_thread, sd_generator  # noqa: F401 - shared fixtures


# -- noise -> image -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "steps", "guidance"), [("sd", 1, 0.0), ("sd", 2, 3.0), ("sd3", 2, 0.0), ("sd3", 2, 4.0), ("flux", 2, 0.0)]
)
def test_noise_to_image_equals_the_pipeline_call(kind, steps, guidance, tiny_pipeline_dir):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    gen = NoiseToImage(pipe, num_inference_steps=steps, guidance_scale=guidance, height=16, width=16)
    prompts = ["a red circle", "two blue squares"]
    noise = gen.sample_noise([11, 12])
    latents = noise
    if kind == "flux":  # the pipeline takes FLUX latents packed into 2x2 patch tokens
        b, c, h, w = noise.shape
        latents = noise.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)
    ref = pipe(
        prompts, latents=latents, num_inference_steps=steps, guidance_scale=guidance, height=16, width=16,
        output_type="pt", generator=torch.Generator().manual_seed(0),
    ).images
    z = noise.clone().requires_grad_(True)
    ours = gen(z, prompts)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    ours.mean().backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def test_noise_is_counter_based_and_device_agnostic(sd_generator):
    a = sd_generator.sample_noise([7])
    b = sd_generator.sample_noise([3, 7])
    torch.testing.assert_close(a[0], b[1])
    ref = torch.randn(sd_generator.noise_shape, generator=torch.Generator("cpu").manual_seed(7))
    torch.testing.assert_close(a[0].cpu(), ref)
    # best-of-8 candidates are the first 8 of best-of-16
    assert sample_seeds(0, 2, 16)[16:24] == sample_seeds(0, 2, 8)[8:16]
    assert len(set(sample_seeds(0, 3, 16))) == 48


def test_bad_inputs_name_the_argument(sd_generator):
    with pytest.raises(RewardInputError, match=r"noise: expected shape \(B, 4, 8, 8\)"):
        sd_generator(torch.zeros(1, 4, 9, 9), ["a"])
    with pytest.raises(RewardInputError, match="same batch size"):
        sd_generator(sd_generator.sample_noise([1, 2]), ["a"])
    with pytest.raises(ConfigError, match="not supported for noise optimisation"):
        NoiseToImage(object())
    # a dtype name is checked against the allowed set before anything is loaded (no getattr(torch, name))
    for bad in ("float64", "Tensor", "__class__"):
        with pytest.raises(ConfigError, match=r"dtype: expected one of \['bfloat16', 'float16', 'float32'\]"):
            NoiseToImage.from_pretrained("/nonexistent/pipeline", dtype=bad)
    with pytest.raises(ConfigError, match="NAME=WEIGHT"):
        parse_weighted(["hpsv2.1=five"])
    assert parse_weighted(["hpsv2.1=5", "imagereward=1", "clipscore"]) == {"hpsv2.1": 5.0, "imagereward": 1.0, "clipscore": 1.0}


def test_objective_weights_and_signs(sd_generator):
    # a weighted sum of a real CLIP-based reward (tiny random weights) and the mock, checked term by term
    import mmreward

    obj = RewardObjective.load({"clipscore": 0.5, "mock": 2.0}, reward_weights="random")
    prompts = ["a red circle", "a blue square"]
    with torch.no_grad():
        images = sd_generator(sd_generator.sample_noise([1, 2]), prompts)
    total, raw = obj(prompts, images)
    clip = obj.terms[0].reward.score(prompts, images).scores
    mock = mmreward.load("mock").score(prompts, images).scores
    torch.testing.assert_close(raw["clipscore"], clip)
    torch.testing.assert_close(total, 0.5 * clip + 2.0 * mock)


def test_objective_can_optimise_an_unclamped_detail(sd_generator):
    # CLIPScore clamps 100*cos at 0 (no gradient below); its "cosine" detail does not
    obj = RewardObjective.load({"clipscore": 100.0}, reward_weights="random", details={"clipscore": "cosine"})
    prompts = ["a red circle", "a blue square"]
    images = sd_generator(sd_generator.sample_noise([1, 2]).requires_grad_(True), prompts)
    total, raw = obj(prompts, images)
    out = obj.terms[0].reward.score(prompts, images)
    torch.testing.assert_close(total, 100.0 * out.details["cosine"])
    torch.testing.assert_close(out.scores, (100.0 * out.details["cosine"]).clamp(min=0))
    assert total.requires_grad
    with pytest.raises(ConfigError, match="no detail 'nope'"):
        RewardObjective.load({"mock": 1.0}, details={"mock": "nope"})(prompts, images.detach())
    with pytest.raises(ConfigError, match="details given for"):
        RewardObjective.load({"mock": 1.0}, details={"clipscore": "cosine"})


# -- best-of-N ------------------------------------------------------------------------------------
def test_best_of_n_picks_the_argmax_and_matches_a_plain_loop(sd_generator, mock_objective):
    prompts = ["a red circle", "a green square"]
    res = best_of_n(sd_generator, mock_objective, prompts, 4, seed=3, batch_size=3, keep_all=True, progress=False)
    assert res.totals.shape == (2, 4) and res.images.shape == (2, 3, 16, 16)
    for p, prompt in enumerate(prompts):
        noise = sd_generator.sample_noise(sample_seeds(3, 2, 4)[4 * p : 4 * p + 4])
        with torch.no_grad():
            imgs = sd_generator(noise, [prompt] * 4)
        scores = mock_objective(prompts[p : p + 1] * 4, imgs)[0]
        torch.testing.assert_close(res.totals[p], scores, rtol=1e-5, atol=1e-6)
        k = int(scores.argmax())
        assert int(res.best_index[p]) == k
        torch.testing.assert_close(res.images[p], imgs[k], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(res.noise[p], noise[k].cpu())


def test_best_of_n_takes_non_differentiable_rewards(sd_generator):
    obj = RewardObjective.load({"jpeg-compressibility": 1.0})
    res = best_of_n(sd_generator, obj, "a red circle", 3, progress=False)
    assert res.totals.shape == (1, 3) and int(res.best_index[0]) == int(res.totals[0].argmax())


def test_best_of_n_curve_equals_brute_force_over_subsets():
    g = torch.Generator().manual_seed(0)
    sel = torch.randn(3, 7, generator=g)
    ev = (torch.rand(3, 7, generator=g) > 0.5).float()
    curve = best_of_n_curve(sel, [1, 2, 3, 7], evaluation=ev)
    for n in (1, 2, 3, 7):
        subsets = list(itertools.combinations(range(7), n))
        brute = torch.tensor(
            [sum(float(ev[p, max(s, key=lambda i: float(sel[p, i]))]) for s in subsets) / len(subsets) for p in range(3)],
            dtype=torch.float64,
        )
        torch.testing.assert_close(curve[n], brute)
    torch.testing.assert_close(curve[1], ev.double().mean(dim=1))  # N=1: a random sample
    expected_max = best_of_n_curve(sel, [7])[7]
    torch.testing.assert_close(expected_max, sel.double().max(dim=1).values)
    with pytest.raises(ConfigError, match="pool size"):
        best_of_n_curve(sel, [8])


# -- exploration ----------------------------------------------------------------------------------
def test_explore_then_optimize_starts_from_the_best_explored_noise(sd_generator, mock_objective):
    prompts = ["a red circle", "a blue square"]
    res = explore_then_optimize(
        sd_generator, mock_objective, prompts, n_explore=4, top_k=2, config=RenoConfig(n_iters=3), progress=False
    )
    assert res.explored_totals.shape == (2, 4)
    # ReNO's starts are the top-2 explored samples of each prompt
    top2 = res.explored_totals.topk(2, dim=1).values.flatten()
    torch.testing.assert_close(res.reno.initial_total, top2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.explored_best_total, res.explored_totals.max(dim=1).values, rtol=1e-5, atol=1e-6)
    assert bool((res.total >= res.explored_best_total).all())
    assert bool((res.total > res.explored_best_total).any())
    with pytest.raises(ConfigError, match="top_k"):
        explore_then_optimize(sd_generator, mock_objective, prompts, n_explore=2, top_k=3)


# -- SDXL (Turbo) family and half precision ---------------------------------------------------------
def _tiny_sdxl(clip_tokenizer_dir):
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    from mmreward.testing.tiny_models import tiny_clip_text_config

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64, norm_num_groups=4,
    )
    vae = AutoencoderKL(block_out_channels=(4, 8), in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, norm_num_groups=2, sample_size=16)
    tok = CLIPTokenizer.from_pretrained(str(clip_tokenizer_dir))
    # SDXL-Turbo's scheduler: Euler with trailing spacing, used at 1 step without guidance
    sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   timestep_spacing="trailing")
    return StableDiffusionXLPipeline(
        vae=vae, text_encoder=CLIPTextModel(tiny_clip_text_config(32)), tokenizer=tok,
        text_encoder_2=CLIPTextModelWithProjection(tiny_clip_text_config(32, projection_dim=32)), tokenizer_2=tok,
        unet=unet, scheduler=sched,
    )


def test_sdxl_turbo_style_pipeline_matches_its_call_and_optimises(clip_tokenizer_dir, mock_objective):
    from diffusion_rl.inference import reno

    pipe = _tiny_sdxl(clip_tokenizer_dir)
    gen = NoiseToImage(pipe, num_inference_steps=1, guidance_scale=0.0, height=16, width=16)
    assert gen.family == "sdxl" and gen.noise_shape == (4, 8, 8)
    noise = gen.sample_noise([4])
    ref = pipe("a red circle", latents=noise, num_inference_steps=1, guidance_scale=0.0, height=16, width=16,
               output_type="pt").images
    with torch.no_grad():
        torch.testing.assert_close(gen(noise, ["a red circle"]), ref, rtol=1e-5, atol=1e-5)
    res = reno(gen, mock_objective, ["a red circle"], RenoConfig(n_iters=3), progress=False)
    assert res.history[0]["grad_norm"][0] > 0


def test_half_precision_pipeline_keeps_the_noise_in_fp32(tiny_pipeline_dir, mock_objective):
    from diffusion_rl.inference import reno

    gen = NoiseToImage.from_pretrained(tiny_pipeline_dir("sd3"), dtype="bfloat16", num_inference_steps=1,
                                       height=16, width=16)
    assert gen.dtype == torch.bfloat16
    res = reno(gen, mock_objective, ["a red circle"], RenoConfig(n_iters=2), progress=False)
    assert res.noise.dtype == torch.float32 and res.images.dtype == torch.float32
    assert res.history[1]["noise_norm"][0] != res.history[0]["noise_norm"][0]
    with pytest.raises(ConfigError, match="dtype"):
        NoiseToImage.from_pretrained(tiny_pipeline_dir("sd3"), dtype=3)


def test_max_sequence_length_reaches_the_t5_encoder(tiny_pipeline_dir):
    gen = NoiseToImage.from_pretrained(tiny_pipeline_dir("sd3"), height=16, width=16, max_sequence_length=4)
    emb = gen.encode(["a red circle"]).tensors["prompt_embeds"]
    assert emb.shape[1] == 77 + 4  # SD3 concatenates the CLIP tokens and the T5 tokens
