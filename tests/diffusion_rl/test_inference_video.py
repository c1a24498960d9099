"""Best-of-N and ReNO on video pipelines (a tiny config-built WanPipeline): the generator is the pipeline's own
sampling, best-of-N picks the argmax of an independent scoring and is reproducible, ReNO raises a
differentiable video reward with its chi regulariser on the 5-D noise, clips are written as mp4 / GIF / PNG
strips, and image/video reward mix-ups are one typed error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from diffusion_rl.inference import NoiseToImage, RenoConfig, RewardObjective, best_of_n, reno
from diffusion_rl.inference.clips import save_clip, write_gif
from diffusion_rl.inference.noise_to_video import NoiseToVideo
from diffusion_rl.inference.objective import RewardTerm
from diffusion_rl.seeding import mix_seed
from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput
from tests._helpers.inference_fixtures import mock_objective, one_thread, sd_generator  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled

H = W = 32
FRAMES = 9  # 3 latent frames
MSL = 16
PROMPTS = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def wan_pipe(tmp_path_factory):
    """The test kit's tiny WanPipeline sampling with flow-matching Euler (what our adapter's ODE path is)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler

    from mmreward.testing.tiny_models import build_clip_tokenizer, build_tiny_pipeline

    tok = tmp_path_factory.mktemp("wan_tok")
    build_clip_tokenizer(tok)
    pipe = build_tiny_pipeline("wan", tok)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    # the kit's 3-channel random VAE is not smooth in its input (its RMS norms over 3 channels amplify a 1e-2
    # latent change into a 0.5 pixel change), so no gradient method can make progress through it; 8 base
    # channels make the decoder smooth (output change linear in the latent change, measured) at ~0.15 s a call
    torch.manual_seed(0)
    pipe.vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                temperal_downsample=[False, True, True]).eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _video_gen(pipe, steps: int = 2, guidance: float = 0.0, **kw) -> NoiseToVideo:
    return NoiseToVideo(pipe, num_inference_steps=steps, guidance_scale=guidance, height=H, width=W,
                        num_frames=FRAMES, max_sequence_length=MSL, **kw)


def _temporal_objective(weight: float = 1.0) -> RewardObjective:
    return RewardObjective.load({"temporal-consistency": weight}, options={"temporal-consistency": {"backbone": "pixels"}})


class _ImageOnly(Reward):
    name = "image-only"
    modalities = ("image",)
    differentiable = True
    requires_prompt = False

    def _score(self, prompts, media):
        return RewardOutput(media.flatten(1).mean(1))


# -- the generator ---------------------------------------------------------------------------------
def test_noise_to_video_is_the_pipelines_own_sampling(wan_pipe):
    gen = _video_gen(wan_pipe, steps=3, guidance=4.0)
    noise = gen.sample_noise([5, 6])
    assert noise.shape == (2, 16, 3, H // 8, W // 8)
    with torch.no_grad():
        video = gen(noise, PROMPTS)
    ref = wan_pipe(PROMPTS, num_inference_steps=3, guidance_scale=4.0, height=H, width=W, num_frames=FRAMES,
                   max_sequence_length=MSL, latents=noise.clone(), output_type="pt").frames
    assert video.shape == (2, FRAMES, 3, H, W) == ref.shape
    assert_close_scaled(video, ref, rel=1e-5)


def test_checkpointing_and_decode_chunks_do_not_change_values_or_gradients(wan_pipe):
    noise = _video_gen(wan_pipe).sample_noise([1, 2])
    grads, videos = [], []
    for kw in ({}, {"gradient_checkpointing": True, "decode_batch_size": 1}, {"decode_batch_size": 2}):
        gen = _video_gen(wan_pipe, **kw)
        z = noise.clone().requires_grad_(True)
        video = gen(z, PROMPTS)
        (video * torch.linspace(0, 1, FRAMES).view(1, -1, 1, 1, 1)).sum().backward()
        grads.append(z.grad)
        videos.append(video.detach())
    for v, g in zip(videos[1:], grads[1:]):
        assert_close_scaled(v, videos[0], rel=1e-5)
        assert_close_scaled(g, grads[0], rel=1e-4)
    assert float(grads[0].abs().max()) > 0


def test_wrong_pipeline_kinds_are_config_errors(wan_pipe, sd_generator):
    with pytest.raises(ConfigError, match="makes images; use NoiseToImage"):
        NoiseToVideo(sd_generator.pipe)
    with pytest.raises(ConfigError, match="makes videos; use NoiseToVideo"):
        NoiseToImage(wan_pipe)


# -- best-of-N -------------------------------------------------------------------------------------
def test_best_of_n_picks_the_argmax_of_an_independent_scoring_and_is_reproducible(wan_pipe):
    gen = _video_gen(wan_pipe)
    objective = RewardObjective.load({"mock": 1.0, "temporal-consistency": 0.5},
                                     options={"temporal-consistency": {"backbone": "pixels"}})
    n, seed = 4, 11
    res = best_of_n(gen, objective, PROMPTS, n, seed=seed, batch_size=3, progress=False)
    assert res.images.shape == (2, FRAMES, 3, H, W) and res.all_images is None
    mock, tc = (t.reward for t in objective.terms)
    for p, prompt in enumerate(PROMPTS):
        totals, videos = [], []
        for i in range(n):  # each candidate on its own: noise from its counter-based seed, scored directly
            z = torch.randn(gen.noise_shape, generator=torch.Generator().manual_seed(mix_seed(seed, p, i)))
            with torch.no_grad():
                v = gen(z[None], [prompt])
            videos.append(v[0])
            totals.append(float(mock.score([prompt], v).scores[0]) + 0.5 * float(tc.score([prompt], v).scores[0]))
        best = max(range(n), key=lambda i: totals[i])
        assert int(res.best_index[p]) == best
        assert_close_scaled(res.totals[p], torch.tensor(totals), rel=1e-5)
        assert_close_scaled(res.images[p], videos[best], rel=1e-5)
        assert len(set(totals)) == n  # distinct candidates: the choice is not a tie-break
    again = best_of_n(gen, objective, PROMPTS, n, seed=seed, batch_size=1, keep_all=True, progress=False)
    assert torch.equal(again.best_index, res.best_index)
    torch.testing.assert_close(again.images, res.images, rtol=0, atol=1e-6)
    torch.testing.assert_close(again.all_images[torch.arange(2), res.best_index], res.images, rtol=0, atol=1e-6)
    other = best_of_n(gen, objective, PROMPTS, n, seed=seed + 1, progress=False)
    assert not torch.allclose(other.totals, res.totals)


def test_image_reward_on_video_pipeline_and_video_reward_on_image_pipeline_are_config_errors(wan_pipe, sd_generator):
    gen = _video_gen(wan_pipe)
    image_only = RewardObjective([RewardTerm("image-only", 1.0, _ImageOnly())])
    with pytest.raises(ConfigError, match=r"\['image-only'\] cannot score the videos a wan pipeline makes.*video-frames"):
        best_of_n(gen, image_only, PROMPTS, 2, progress=False)
    with pytest.raises(ConfigError, match="cannot score the videos"):
        reno(gen, image_only, PROMPTS, RenoConfig(n_iters=1), progress=False)
    with pytest.raises(ConfigError, match=r"\['temporal-consistency'\] cannot score the images a sd pipeline makes"):
        best_of_n(sd_generator, _temporal_objective(), ["a red circle"], 2, progress=False)


# -- ReNO ------------------------------------------------------------------------------------------
def test_reno_raises_a_differentiable_video_reward(wan_pipe):
    gen = _video_gen(wan_pipe, steps=2)
    cfg = RenoConfig(n_iters=6, lr=5.0, reg_weight=0.01)  # the paper's optimiser; weight 100 sets the reward scale
    res = reno(gen, _temporal_objective(100.0), PROMPTS, cfg, progress=False)
    tc = torch.tensor([h["temporal-consistency"] for h in res.history])  # (iters, B) raw consistency in [-1, 1]
    gain = tc[-1] - tc[0]
    # measured: each prompt's inconsistency 1 - tc (~0.012 at the start) falls by ~15 % in 5 steps; ask for 5 %
    assert (gain > 0.05 * (1 - tc[0])).all(), (tc[0], gain)
    assert float((tc[1:] > tc[:-1]).float().mean()) >= 0.8  # monotone-ish: most steps go up
    assert res.noise.shape == (2, 16, 3, H // 8, W // 8) and res.images.shape == (2, FRAMES, 3, H, W)
    torch.testing.assert_close(res.best_total, 100 * tc.max(dim=0).values, rtol=1e-6, atol=1e-5)


def test_reno_regulariser_on_video_noise_is_the_chi_negative_log_density(wan_pipe):
    gen = _video_gen(wan_pipe, steps=1)
    cfg = RenoConfig(n_iters=2, lr=5.0, reg_weight=0.01)
    objective = _temporal_objective(100.0)
    res = reno(gen, objective, PROMPTS, cfg, progress=False)
    z0 = res.initial_noise.double()
    d = z0[0].numel()
    assert d == 16 * 3 * 4 * 4  # the whole clip's noise is one d-dimensional Gaussian
    r = z0.flatten(1).norm(dim=1)
    # ||z|| ~ chi(d): log p(r) = log p_chi2(r^2) + log 2r; R = -log p(r) - (d/2 - 1) log 2 - lgamma(d/2) exactly
    chi2 = torch.distributions.Chi2(torch.tensor(float(d), dtype=torch.float64))
    neg_log_p = -(chi2.log_prob(r**2) + torch.log(2 * r))
    expected = neg_log_p - (d / 2 - 1) * math.log(2) - math.lgamma(d / 2)
    assert_close_scaled(torch.tensor(res.history[0]["regularizer"], dtype=torch.float64), expected, rel=1e-5)

    # the first step is clipped Nesterov SGD on -reward + lambda R over the 5-D noise (computed independently)
    z = res.initial_noise.clone().requires_grad_(True)
    total = 100 * objective.terms[0].reward.score(PROMPTS, gen(z, PROMPTS)).scores
    rz = z.flatten(1).norm(dim=1)
    loss = -total.sum() + 0.01 * (0.5 * rz**2 - (d - 1) * torch.log(rz)).sum()
    (grad,) = torch.autograd.grad(loss, z)
    gn = grad.flatten(1).norm(dim=1)
    z1 = z.detach() - 5.0 * 1.9 * grad * (0.1 / (gn + 1e-6)).clamp(max=1.0).view(-1, 1, 1, 1, 1)
    assert_close_scaled(torch.tensor(res.history[1]["noise_norm"]), z1.flatten(1).norm(dim=1), rel=1e-5)
    assert_close_scaled(torch.tensor(res.history[0]["grad_norm"]), gn, rel=1e-4)


# -- writing clips ---------------------------------------------------------------------------------
def _clip(t: int = 6, h: int = 16, w: int = 24) -> torch.Tensor:
    """A smooth moving gradient (compresses well, so the mp4 round trip is close)."""
    ys, xs = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    frames = [torch.stack([(xs + k / t) % 1.0, ys, 0.5 * torch.ones_like(xs)]) for k in range(t)]
    return torch.stack(frames)


def test_save_clip_writes_mp4_and_a_lossless_strip(tmp_path):
    from PIL import Image

    from diffusion_rl.inference.clips import mp4_available
    from mmreward.media import load_video

    if not mp4_available():
        pytest.skip("PyAV with libx264 is not installed (the `video` extra)")
    clip = _clip()
    paths = save_clip(clip, tmp_path / "best_000", fps=4)
    assert [p.name for p in paths] == ["best_000.mp4", "best_000.png"]
    back = load_video(str(paths[0]))  # (T, 3, H, W) in [0, 1] through PyAV/decord
    assert back.shape == clip.shape
    assert float((back - clip).abs().mean()) < 0.03  # lossy H.264 at crf 18 on a smooth clip
    strip = torch.from_numpy(np.array(Image.open(paths[1])))
    expected = (clip.clamp(0, 1) * 255).round().to(torch.uint8).permute(2, 0, 3, 1).reshape(16, 6 * 24, 3)
    assert torch.equal(strip, expected)


def test_save_clip_falls_back_to_gif_without_an_encoder_or_with_odd_sides(tmp_path, monkeypatch):
    from PIL import Image

    from diffusion_rl.inference import clips

    odd = _clip(h=15)
    assert save_clip(odd, tmp_path / "odd")[0].suffix == ".gif"
    monkeypatch.setattr(clips, "mp4_available", lambda: False)
    gif = save_clip(_clip(t=5), tmp_path / "nompeg")[0]
    assert gif.suffix == ".gif"
    with Image.open(gif) as im:
        assert im.n_frames == 5 and im.size == (24, 16)
    with pytest.raises(Exception, match=r"expected \(T, 3, H, W\)"):
        write_gif(torch.rand(2, 5, 3, 8, 8), tmp_path / "bad.gif")


# -- command line ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan_dir(tiny_pipeline_dir):
    """The session's tiny Wan pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("wan"))


def test_cli_best_of_n_on_a_video_pipeline_writes_clips(wan_dir, tmp_path, capsys):
    from diffusion_rl.cli import main

    out = tmp_path / "bon"
    rc = main(["best-of-n", "--pipeline", wan_dir, "--prompt", PROMPTS[0], "--reward", "mock=1", "--n", "2",
               "--num-frames", "5", "--height", "16", "--width", "16", "--max-sequence-length", "8", "--steps", "1",
               "--device", "cpu", "--output", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["totals"][0]) == 2 and summary["best_index"][0] == max(range(2), key=summary["totals"][0].__getitem__)
    assert (out / "best_000.png").is_file()
    assert (out / "best_000.mp4").is_file() or (out / "best_000.gif").is_file()


@pytest.mark.parametrize("extra, message", [
    (["--reward", "jpeg-compressibility=1"], "cannot score the videos a wan pipeline makes"),
    (["--reward", "mock=1", "--num-frames", "6"], "num_frames - 1 must be a multiple of 4"),
])
def test_cli_video_usage_errors_are_one_line_exit_2(wan_dir, tmp_path, capsys, extra, message):
    from diffusion_rl.cli import main

    rc = main(["best-of-n", "--pipeline", wan_dir, "--prompt", "a red circle", "--n", "2", "--height", "16",
               "--width", "16", "--device", "cpu", "--output", str(tmp_path), "--no-progress", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_cli_num_frames_on_an_image_pipeline_is_exit_2(tiny_pipeline_dir, tmp_path, capsys):
    from diffusion_rl.cli import main

    rc = main(["best-of-n", "--pipeline", str(tiny_pipeline_dir("sd")), "--prompt", "a red circle", "--reward", "mock=1",
               "--n", "2", "--num-frames", "9", "--device", "cpu", "--output", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--num-frames is for video pipelines" in err and err.count("\n") == 1, err
