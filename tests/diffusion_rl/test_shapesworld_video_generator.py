"""The ShapesWorld text-to-video model: its identity Wan VAE, held-out split, trainer and clip grids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmreward.errors import ConfigError, RewardInputError
from mmreward.synthetic.motion import all_motion_specs, motion_is_held_out, motion_specs_for_split
from mmreward.synthetic.prompts import HELD_OUT_PAIRS


@pytest.mark.parametrize("frames", [8, 5])
def test_identity_wan_vae_decodes_any_frame_count_exactly(frames):
    from mmreward.synthetic.identity_wan_vae import build_identity_wan_vae

    vae = build_identity_wan_vae()
    x = torch.rand(2, 3, frames, 16, 24, generator=torch.Generator().manual_seed(frames)) * 2 - 1
    with torch.no_grad():
        y = vae.decode(x).sample
    assert y.shape == x.shape  # no spatial or temporal up-sampling: latents are the pixels
    # relative error of the norm trick: |x|^2 / (2 K^2) <= 1.5e-6 per pixel; fp32 rounding adds ~1e-7
    assert (y - x).abs().max() <= 1e-5
    assert vae.config.scale_factor_spatial == 1 and vae.config.scale_factor_temporal == 1


def test_identity_wan_vae_encodes_exactly_and_adds_only_tiny_noise():
    from mmreward.synthetic.identity_wan_vae import build_identity_wan_vae

    vae = build_identity_wan_vae()
    # diffusers' encoder loop walks 1 + 4k frames (it assumes temporal factor 4), so encode 9 frames
    x = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        dist = vae.encode(x).latent_dist
    assert (dist.mean - x).abs().max() <= 1e-5
    assert dist.std.max() <= 1e-6  # log-variance -30: std 3e-7


def test_motion_split_holds_out_exactly_the_held_out_colour_shape_pairs():
    train, held = motion_specs_for_split("train"), motion_specs_for_split("heldout")
    assert len(train) + len(held) == len(all_motion_specs()) and set(train).isdisjoint(held)
    for spec in held:
        c = spec.objects[0]
        assert (c.color, c.shape) in HELD_OUT_PAIRS or (c.end_color, c.shape) in HELD_OUT_PAIRS
    assert not any(motion_is_held_out(s) for s in train)
    with pytest.raises(RewardInputError, match="split"):
        motion_specs_for_split("test")


def test_save_grid_draws_one_strip_of_frames_per_clip(tmp_path):
    import numpy as np
    from PIL import Image

    from diffusion_rl.reporting import save_grid

    b, t, h, w = 3, 4, 6, 5
    clips = torch.zeros(b, t, 3, h, w)
    for i in range(b):
        for j in range(t):
            clips[i, j, 0] = (i * t + j) / (b * t)  # each frame its own red level
    arr = torch.from_numpy(np.array(Image.open(save_grid(clips, tmp_path / "g.png"))))
    assert arr.shape == (b * (h + 2), t * (w + 2), 3)
    for i in range(b):
        for j in range(t):
            pixel = arr[i * (h + 2) + 1 + h // 2, j * (w + 2) + 1 + w // 2, 0].item()
            assert abs(pixel - round((i * t + j) / (b * t) * 255)) <= 1


def test_video_generator_config_rejects_unrepresentable_patches():
    from mmreward.synthetic.build.train_video_generator import VideoGeneratorTrainConfig

    with pytest.raises(ConfigError, match="output projection"):
        VideoGeneratorTrainConfig(width=64, patch_t=2, patch=4)  # 3 * 2 * 16 = 96 values per token > 64
    with pytest.raises(ConfigError, match="divisible by patch_t"):
        VideoGeneratorTrainConfig(num_frames=7, patch_t=2)
    with pytest.raises(ConfigError, match="stop_at"):
        VideoGeneratorTrainConfig(steps=10, stop_at=11)


def test_video_generator_trains_exports_and_loads_as_wan_pipeline(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline

    from mmreward.synthetic.build import train_video_generator as tvg
    from mmreward.synthetic.build.evaluate_video_generator import generate

    cfg = tvg.VideoGeneratorTrainConfig(out=str(tmp_path / "gen"), work=str(tmp_path / "work"), steps=6, stop_at=3,
                                        batch_size=2, layers=1, width=96, ffn=96, text_width=32, warmup=1)
    out = tvg.train(cfg)
    state = torch.load(tmp_path / "work" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 3 and len(state["log"]) == 3 and all(v == v and v > 0 for v in state["log"])
    meta = json.loads((out / "shapesworld.json").read_text())
    assert meta["trained_steps"] == 3 and meta["generation_defaults"]["num_frames"] == 8
    pipe = DiffusionPipeline.from_pretrained(str(out))
    assert isinstance(pipe, WanPipeline)
    pipe.set_progress_bar_config(disable=True)
    clips = generate(pipe, ["a red circle moving left at 2 pixels per frame"] * 2, num_inference_steps=2)
    assert clips.shape == (2, 8, 3, 32, 32)  # the pipeline's num_frames rounding is undone by the call helper
    # the exported weights are the EMA, not the last training weights
    trained = dict(tvg.trained_modules(pipe)["transformer"].named_parameters())
    name = "proj_out.weight"
    assert not torch.equal(trained[name], state["params"][f"transformer.{name}"])
    assert torch.allclose(trained[name], state["ema"][f"transformer.{name}"])


def test_video_generator_card_reports_measured_rates_and_the_frame_rounding(tmp_path):
    import random
    from dataclasses import asdict

    from mmreward.synthetic.build.evaluate_video_generator import summarize, write_card
    from mmreward.synthetic.build.train_video_generator import GENERATION_DEFAULTS, VideoGeneratorTrainConfig
    from mmreward.synthetic.motion import parse_motion_prompt, realize_clip, render_clips

    prompts = ["a red circle moving left at 2 pixels per frame", "a blue square moving up at 1 pixel per frame"]
    rng = random.Random(0)
    clips = render_clips([realize_clip(parse_motion_prompt(p), rng) for p in prompts])
    clips[1] = clips[1, :1].expand_as(clips[1])  # a still clip: every clause but motion holds
    m = summarize(prompts, clips)
    assert m["strict"]["mean"] == 0.5 and m["motion"]["mean"] == 0.5 and m["object"]["mean"] == 1.0
    assert m["partial"]["mean"] == pytest.approx((1 + 3 / 4) / 2, rel=1e-3)
    assert m["strict"]["se"] == pytest.approx(0.5, rel=1e-3)  # std 0.7071 of (1, 0) over sqrt(2)
    (tmp_path / "shapesworld.json").write_text(json.dumps({
        "generation_defaults": GENERATION_DEFAULTS, "trained_steps": 7, "train_minutes": 0.1,
        "config": asdict(VideoGeneratorTrainConfig())}))
    write_card(tmp_path, {"heldout": {**m, "seconds_per_clip": 0.5}, "train": {**m, "seconds_per_clip": 0.5}})
    card = (tmp_path / "README.md").read_text()
    assert "0.500 ± 0.500" in card and "num_frames=7" in card and "max_sequence_length=20" in card


@pytest.mark.slow
def test_build_assets_quick_video_generator(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline

    from mmreward.synthetic.build.build_assets import main

    timings = main(["--quick", "--only", "video-generator", "--root", str(tmp_path / "a"), "--work", str(tmp_path / "w")])
    folder = tmp_path / "a" / "video-generator"
    assert set(timings) == {"video-generator"} and (folder / "README.md").is_file()
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["heldout"]["clips"] == 4 and 0 <= metrics["heldout"]["strict"]["mean"] <= 1
    pipe = DiffusionPipeline.from_pretrained(str(folder))
    assert isinstance(pipe, WanPipeline) and type(pipe.text_encoder).__name__ == "CLIPTextModel"
    meta = json.loads((folder / "shapesworld.json").read_text())
    assert meta["generation_defaults"]["num_frames"] == 4 and meta["config"]["centred_after"] == 1
    assert "centred clips" in (folder / "README.md").read_text()


def test_video_generator_resume_equals_an_uninterrupted_run(tmp_path):
    from mmreward.synthetic.build import train_video_generator as tvg

    def run(name: str, stops: list[int]) -> dict:
        for stop in stops:
            tvg.train(tvg.VideoGeneratorTrainConfig(
                out=str(tmp_path / name / "gen"), work=str(tmp_path / name / "work"), steps=4, stop_at=stop,
                batch_size=2, layers=1, width=96, ffn=96, text_width=32, warmup=1, ckpt_every=2, export_every=4))
        return torch.load(tmp_path / name / "work" / "checkpoint.pt", weights_only=True)

    straight, resumed = run("straight", [4]), run("resumed", [2, 4])
    assert resumed["step"] == straight["step"] == 4 and resumed["log"] == straight["log"]
    for k, v in straight["params"].items():
        torch.testing.assert_close(resumed["params"][k], v, rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_wan_pipeline_sampling_integrates_the_trained_velocity_convention(tmp_path):
    """WanPipeline's sampling is the Euler ODE of what flow_matching_loss trains, written out by hand here:
    x_t = (1 - s) x0 + s eps, velocity eps - x0, timestep s * 1000, the shift-1 grid linspace(1, 1/1000, N)
    then 0, CFG u + g (c - u) with the empty prompt as u, and an identity decode (latents_mean 0, std 1)."""
    from mmreward.synthetic.build import train_video_generator as tvg
    from mmreward.synthetic.build.evaluate_video_generator import pipeline_call_kwargs

    torch.manual_seed(0)
    cfg = tvg.VideoGeneratorTrainConfig(layers=1, width=64, ffn=64, text_width=32, patch_t=1)
    pipe = tvg.build_pipeline(cfg, tmp_path / "tok")
    pipe.set_progress_bar_config(disable=True)
    # perturb the fresh weights so the velocity is large enough for a wrong sign or time scale to show
    for p in pipe.transformer.parameters():
        p.add_(0.05 * torch.randn_like(p))
    prompts = ["a red circle moving left at 2 pixels per frame", "a blue square moving up at 1 pixel per frame"]
    n, g = 4, 3.0
    latents = torch.randn(2, 3, 8, 32, 32, generator=torch.Generator().manual_seed(1))
    got = pipe(prompts, latents=latents.clone(), output_type="pt",
               **pipeline_call_kwargs(num_inference_steps=n, guidance_scale=g)).frames

    def embed(texts: list[str]) -> torch.Tensor:
        return pipe._get_t5_prompt_embeds(texts, max_sequence_length=20, device="cpu", dtype=torch.float32)

    cond, uncond = embed(prompts), embed([""] * 2)
    sigmas = torch.cat([torch.linspace(1.0, 1e-3, n), torch.zeros(1)]).tolist()
    x = latents.clone()
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        t = torch.full((2,), s * 1000)
        c = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=cond, return_dict=False)[0]
        u = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=uncond, return_dict=False)[0]
        x = x + (s_next - s) * (u + g * (c - u))  # sigma falls, so this moves against eps - x0
    want = ((x.clamp(-1, 1) + 1) / 2).permute(0, 2, 1, 3, 4)
    assert got.shape == want.shape == (2, 8, 3, 32, 32)
    assert (x - latents).abs().mean() > 0.1  # the velocity moved the sample, so the comparison has teeth
    assert torch.allclose(got.float(), want, atol=1e-4)


def test_four_frame_generator_with_the_clip_text_tower_exports_its_geometry(tmp_path):
    from diffusers import DiffusionPipeline
    from safetensors.torch import load_file
    from transformers import CLIPTextModel

    from mmreward.synthetic.build import train_video_generator as tvg
    from mmreward.synthetic.build.evaluate_video_generator import generate, load_video_generator

    clip = Path(__file__).resolve().parents[2] / "assets" / "shapesworld" / "clip"
    cfg = tvg.VideoGeneratorTrainConfig(out=str(tmp_path / "gen"), work=str(tmp_path / "work"), steps=1,
                                        batch_size=2, layers=1, width=96, ffn=96, text_width=64, warmup=1,
                                        num_frames=4, text_encoder=str(clip))
    pipe = tvg.build_pipeline(cfg, tmp_path / "tok")
    # the text encoder starts as the CLIP's text tower, weight for weight
    clip_weights = load_file(str(clip / "model.safetensors"))
    for k, v in pipe.text_encoder.state_dict().items():
        assert torch.equal(v, clip_weights[f"text_model.{k}"]), k
    out = tvg.train(cfg)
    meta = json.loads((out / "shapesworld.json").read_text())
    assert meta["generation_defaults"]["num_frames"] == 4
    assert isinstance(DiffusionPipeline.from_pretrained(str(out)).text_encoder, CLIPTextModel)
    clips = generate(load_video_generator(out), ["a red circle moving left"] * 2, num_inference_steps=2)
    assert clips.shape == (2, 4, 3, 32, 32)  # the evaluator takes the clip length from the folder
    with pytest.raises(ConfigError, match="text-width"):
        tvg.build_pipeline(tvg.VideoGeneratorTrainConfig(text_encoder=str(clip), text_width=32), tmp_path / "tok2")


def test_training_batches_switch_to_centred_clips_at_centred_after():
    from mmreward.synthetic.build import train_video_generator as tvg
    from mmreward.synthetic.motion import motion_specs_for_split

    cfg = tvg.VideoGeneratorTrainConfig(batch_size=8, num_frames=4, centred_after=5, cfg_dropout=0.0)
    specs = motion_specs_for_split("train")

    def centre_offsets(step: int) -> torch.Tensor:
        # the box around everything the object covers over the clip is centred when its path is
        _, video = tvg._batch(step, cfg, specs)  # (B, 3, T, H, W) in [-1, 1] on a black background
        covered = (video > -0.5).any(1).any(1)  # (B, H, W)
        out = []
        for m in covered:
            ys, xs = m.nonzero(as_tuple=True)
            out.append(max(abs((xs.min() + xs.max()) / 2 - 15.5), abs((ys.min() + ys.max()) / 2 - 15.5)))
        return torch.stack(out).float()

    assert (centre_offsets(5) <= 1.0).all() and (centre_offsets(9) <= 1.0).all()  # whole-pixel rounding
    assert (centre_offsets(4) > 2.0).any()  # before the switch, starts are drawn at random


def test_write_prompt_sets_writes_the_training_and_held_out_pair_prompts(tmp_path):
    from mmreward.synthetic.build.evaluate_video_generator import (
        heldout_pair_prompts,
        recipe_eval_prompts,
        write_prompt_sets,
    )
    from mmreward.synthetic.motion import parse_motion_prompt

    write_prompt_sets(tmp_path, n_train=10, evaluated=heldout_pair_prompts()[:5])
    train = (tmp_path / "prompts" / "train.txt").read_text().splitlines()
    pairs = (tmp_path / "prompts" / "heldout_pairs.txt").read_text().splitlines()
    assert len(train) == len(set(train)) == 10
    assert pairs == heldout_pair_prompts()[5:] and len(pairs) == 48 - 5
    assert all(parse_motion_prompt(p).num_objects == 1 for p in pairs)
    write_prompt_sets(tmp_path)  # default: the recipe's evaluated prompts are left out
    default = (tmp_path / "prompts" / "heldout_pairs.txt").read_text().splitlines()
    assert len(default) == 24 and not set(default) & set(recipe_eval_prompts())
