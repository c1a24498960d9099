"""ShapesWorld model plumbing: tokenizer, identity VAE, flow-matching convention, trainers (smoke), corruptions."""

from __future__ import annotations

import json
import random

import pytest
import torch

import mmreward
from mmreward.synthetic import caption, sample_scenes
from mmreward.synthetic.build.corruptions import corrupt_scene, degrade
from mmreward.synthetic.checker import check, scene_detections
from mmreward.synthetic.identity_vae import build_identity_vae
from mmreward.synthetic.scenes import render, specs_for_split
from mmreward.synthetic.tokenizer import build_shapes_tokenizer, shapes_words


def test_small_vocab_tokenizer_matches_full_clip_bpe(tmp_path, clip_tokenizer_dir):
    from transformers import AutoTokenizer

    small = build_shapes_tokenizer(tmp_path)
    full = AutoTokenizer.from_pretrained(clip_tokenizer_dir)
    assert len(small) < 1000
    texts = [caption(s, photo=p) for specs in specs_for_split("all").values() for s in specs[:40] for p in (0, 1)]
    texts += [" ".join(shapes_words()), "A photo of a cat next to a dog."]
    for text in texts:
        assert small.tokenize(text) == full.tokenize(text), text
    # words outside the vocabulary still tokenise (into smaller pieces), never to <unk>
    assert "".join(small.tokenize("zebra")).replace("</w>", "") == "zebra"


def test_identity_vae_is_the_identity():
    vae = build_identity_vae()
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(vae.decode(x).sample, x, atol=1e-4, rtol=0)
        torch.testing.assert_close(vae.encode(x).latent_dist.mode(), x, atol=1e-4, rtol=0)
    assert vae.config.scaling_factor == 1.0 and vae.config.shift_factor == 0.0


def test_training_interpolation_matches_the_scheduler():
    """x_t = (1 - s) x0 + s eps and target eps - x0 are FlowMatchEuler's conventions."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=1.0)
    sched.set_timesteps(10)
    x0, eps = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    t = sched.timesteps[3]
    s = sched.sigmas[3]
    torch.testing.assert_close(sched.scale_noise(x0, t.view(1), eps), (1 - s) * x0 + s * eps)
    # one Euler step with the exact velocity lands on the straight line between eps and x0
    xt = (1 - s) * x0 + s * eps
    nxt = sched.step(eps - x0, t, xt).prev_sample
    s2 = sched.sigmas[4]
    torch.testing.assert_close(nxt, (1 - s2) * x0 + s2 * eps, atol=1e-5, rtol=1e-5)


def test_generator_trainer_smoke_saves_loads_and_resumes(tmp_path):
    from diffusers import DiffusionPipeline

    from mmreward.synthetic.build.train_generator import GENERATION_DEFAULTS, main

    args = ["--out", str(tmp_path / "gen"), "--work", str(tmp_path / "work"), "--batch-size", "2",
            "--width", "64", "--layers", "1", "--warmup", "1", "--ckpt-every", "1", "--export-every", "2"]
    main(args + ["--steps", "2"])
    state = torch.load(tmp_path / "work" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 2 and len(state["log"]) == 2
    main(args + ["--steps", "3"])  # resumes at step 2, trains one more step
    state = torch.load(tmp_path / "work" / "checkpoint.pt", weights_only=True)
    assert state["step"] == 3 and len(state["log"]) == 3
    meta = json.loads((tmp_path / "gen" / "shapesworld.json").read_text())
    assert meta["trained_steps"] == 3 and meta["generation_defaults"] == GENERATION_DEFAULTS
    pipe = DiffusionPipeline.from_pretrained(tmp_path / "gen")
    pipe.set_progress_bar_config(disable=True)
    out = pipe(["a red circle", "two squares"], num_inference_steps=2, max_sequence_length=4, output_type="pt",
               generator=torch.Generator().manual_seed(0)).images
    assert out.shape == (2, 3, 32, 32) and 0 <= out.min() and out.max() <= 1
    embeds = pipe.encode_prompt(["a red circle"], None, None, do_classifier_free_guidance=False,
                                max_sequence_length=4)[0]
    assert embeds.shape[1] == 16 + 4 and embeds[:, 16:].abs().max() == 0  # null T5 tokens are zeros


def test_generator_config_rejects_a_rank_deficient_output():
    from mmreward.errors import ConfigError
    from mmreward.synthetic.build.train_generator import GeneratorTrainConfig

    with pytest.raises(ConfigError, match="3 \\* patch\\^2 = 192"):
        GeneratorTrainConfig(patch=8, width=128)


def test_clip_trainer_smoke(tmp_path):
    from transformers import AutoTokenizer, CLIPModel

    from mmreward.synthetic.build.train_clip import main

    metrics = main(["--out", str(tmp_path), "--steps", "2", "--batch-size", "8", "--eval-images", "4"])
    assert set(metrics) == set(specs_for_split("heldout"))
    assert all(0 <= m["top1"] <= 1 and 0 <= m["chance"] < 1 for m in metrics.values())
    CLIPModel.from_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tmp_path)
    assert "zero-shot top-1" in (tmp_path / "README.md").read_text()


def test_semantic_corruptions_break_the_prompt_and_degrade_is_graded():
    rng = random.Random(0)
    scenes = sample_scenes(60, seed=4, split="all")
    bad = [corrupt_scene(s, rng) for s in scenes]
    assert check([s.spec for s in bad], scene_detections(bad)).strict.sum() == 0
    img = render(scenes[:8])
    g = torch.Generator().manual_seed(0)
    assert torch.equal(degrade(img, torch.zeros(8), g), img)
    err = [(degrade(img, torch.full((8,), lv), torch.Generator().manual_seed(1)) - img).abs().mean() for lv in (0.2, 0.8)]
    assert err[0] < err[1]


@pytest.mark.parametrize("name", ["shapesworld-pref", "shapesworld-aesthetic"])
def test_random_weight_rewards_are_differentiable(name):
    reward = mmreward.load(name, weights="random")
    x = render(sample_scenes(2, seed=0)).requires_grad_(True)
    reward.score(["a red circle", "two squares"], x).scores.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.slow
def test_build_assets_quick_end_to_end(tmp_path):
    from mmreward.synthetic.build.build_assets import main

    timings = main(["--quick", "--root", str(tmp_path / "assets"), "--work", str(tmp_path / "work")])
    assert set(timings) == {"clip", "generator", "pref"}
    for name in ("clip", "generator", "pref", "aesthetic"):
        assert (tmp_path / "assets" / name / "README.md").is_file()
    assert type(mmreward.load(str(tmp_path / "assets" / "pref"))).__name__ == "CLIPPreferenceReward"
