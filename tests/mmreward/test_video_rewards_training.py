"""Video rewards inside training: the `motion` reward, frame sampling by each reward's own card (not the
generator's frame count), weighted mixes of video rewards and Pref-GRPO with a video judge on tiny Wan."""

from __future__ import annotations

import json

import pytest
import torch

import mmreward
from mmreward.errors import ConfigError, RewardInputError

H = W = 32
PROMPTS = ["a red circle moving left", "a blue square moving up"]


def _clip(values: list[float], size: int = 4) -> torch.Tensor:
    """(1, T, 3, size, size): frame t filled with values[t]."""
    return torch.tensor(values).view(1, -1, 1, 1, 1).expand(1, len(values), 3, size, size).clone()


def test_motion_is_the_mean_absolute_frame_difference():
    motion = mmreward.load("motion")
    assert motion.modalities == ("video",) and motion.differentiable
    # |0.5 - 0| + |0.5 - 0.5| + |1 - 0.5| over 3 steps
    assert motion.score("x", _clip([0.0, 0.5, 0.5, 1.0])).scores.item() == pytest.approx(1 / 3, rel=1e-6)
    assert motion.score("x", _clip([0.3] * 5)).scores.item() == 0.0
    # a 2-pixel square moving one pixel right per frame on black: each step changes 2 columns x 2 rows x 3
    # channels = 12 of the 3 * 8 * 8 = 192 values by 1
    clip = torch.zeros(1, 4, 3, 8, 8)
    for t in range(4):
        clip[0, t, :, 3:5, t:t + 2] = 1.0
    assert motion.score("x", clip).scores.item() == pytest.approx(12 / 192, rel=1e-6)
    # the card's num_frames sets the spacing: frames 0 and 3 only
    two = mmreward.load("motion", num_frames=2)
    assert two.score("x", _clip([0.0, 0.5, 0.5, 1.0])).scores.item() == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(RewardInputError, match="num_frames must be an integer >= 2"):
        mmreward.load("motion", num_frames=1)


def test_temporal_consistency_follows_its_num_frames():
    gen = torch.Generator().manual_seed(0)
    clip = torch.rand(2, 9, 3, 8, 8, generator=gen)
    sub = mmreward.load("temporal-consistency", backbone="pixels", num_frames=4)
    full = mmreward.load("temporal-consistency", backbone="pixels")
    # uniform card sampling of 9 frames into 4: round(linspace(0, 8, 4)) = 0, 3, 5, 8
    expected = full.score(["x", "y"], clip[:, [0, 3, 5, 8]]).scores
    torch.testing.assert_close(sub.score(["x", "y"], clip).scores, expected, rtol=1e-6, atol=0)
    assert not torch.allclose(full.score(["x", "y"], clip).scores, expected)


# ------------------------------------------------------------------------------------------------
# on the tiny Wan pipeline
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wan_pipe(tmp_path_factory):
    from mmreward.testing.tiny_models import frozen_tiny_pipeline

    return frozen_tiny_pipeline("wan", tmp_path_factory.mktemp("vr_tok"))


@pytest.fixture(scope="module")
def videoreward_dir(tmp_path_factory):
    """A tiny VideoReward checkpoint (full model.pth layout) whose card samples num_frames = 4."""
    pytest.importorskip("transformers")
    from mmreward.models.vlm_heads import write_videoalign_config
    from mmreward.testing.qwen_vl import build_tiny_qwen_vl

    root = tmp_path_factory.mktemp("videoreward")
    base = root / "base"
    build_tiny_qwen_vl(base)
    donor = mmreward.load("videoalign", weights="random", tiny=True, base_model=str(base))
    folder = root / "ckpt"
    cfg_path = write_videoalign_config(folder, str(base), None)
    cfg = json.loads(cfg_path.read_text())
    cfg["data_config"]["num_frames"] = 4
    cfg_path.write_text(json.dumps(cfg))
    (folder / "checkpoint-1").mkdir()
    state = {**donor.vlm.state_dict(), **{f"rm_head.{k}": v for k, v in donor.rm_head.state_dict().items()}}
    torch.save(state, folder / "checkpoint-1" / "model.pth")
    return folder


def test_videoalign_card_samples_4_of_a_9_frame_rollout(wan_pipe, videoreward_dir, monkeypatch):
    """The rollout hands the reward the full 9-frame clip; VideoAlign's card (data_config.num_frames = 4)
    picks frames round(linspace(0, 8, 4)) = 0, 3, 5, 8 of it."""
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import make_adapter
    from diffusion_rl.rollout import rollout
    from mmreward.backbones import qwen_vl
    from mmreward.prompt_sources import score_with_metadata

    reward = mmreward.load("videoalign", checkpoint=str(videoreward_dir), min_pixels=28 * 28, max_pixels=56 * 56)
    assert reward.num_frames == 4
    adapter = make_adapter(wan_pipe, H, W, 16, num_frames=9)
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=2, guidance_scale=1.0,
                   kernel=Kernel("flow_sde", 0.7), seed=0, epoch=0)
    assert traj.images.shape == (2, 9, 3, H, W)
    seen = []
    real = qwen_vl.build_batch

    def spy(processor, texts, media, **kw):
        seen.extend(m.detach().clone() for m in media)
        return real(processor, texts, media, **kw)

    monkeypatch.setattr(qwen_vl, "build_batch", spy)
    out = score_with_metadata(reward, PROMPTS, traj.images, PROMPTS)  # as Trainer.collect scores
    assert out.scores.shape == (2,) and torch.isfinite(out.scores).all()
    assert len(seen) == 2
    for clip, full in zip(seen, traj.images):
        assert torch.equal(clip, full[[0, 3, 5, 8]].to(clip.dtype))


def _wan_cfg(pipe_dir: str, out, reward: dict, **train) -> dict:
    return {
        "model": {"pretrained": pipe_dir, "height": H, "width": W, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 16},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 3, "batch_size": 6},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "probe": "error",
                  "timestep_fraction": 0.5, **train},
        "advantage": {"std_scope": "group", "unbiased": True, "eps": 1e-8},
        "reward": reward,
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.fixture(scope="module")
def wan_dir(tiny_pipeline_dir):
    """The session's tiny Wan pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("wan"))


def _motion(videos: torch.Tensor) -> torch.Tensor:
    """Independent: mean |x[t+1] - x[t]| per clip, in float64."""
    v = videos.double()
    return (v[:, 1:] - v[:, :-1]).abs().mean(dim=(1, 2, 3, 4))


def test_weighted_mix_of_video_rewards_in_a_grpo_iteration(wan_dir, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    weights = {"motion": 1.0, "temporal-consistency": 0.5, "video-frames": -0.25}
    reward = {"rewards": weights, "options": {"temporal-consistency": {"backbone": "pixels", "num_frames": 5},
                                              "video-frames": {"image_reward": "mock", "num_frames": 3}}}
    trainer = Trainer(from_dict(_wan_cfg(wan_dir, tmp_path, reward)))
    metrics = trainer.train_iteration(0)
    videos = trainer.last_images
    assert videos.ndim == 5 and videos.shape[0] == 6
    motion = _motion(videos)
    assert metrics["reward/motion"] == pytest.approx(float(motion.mean()), rel=1e-5)
    combined = sum(w * metrics[f"reward/{n}"] for n, w in weights.items())
    assert metrics["reward/combined"] == pytest.approx(combined, rel=1e-5, abs=1e-6 * max(abs(combined), 1e-3))
    assert metrics["train/grad_norm"] > 0


def test_pref_grpo_with_a_video_judge(wan_dir, tmp_path):
    """The judge compares clips by Bradley-Terry on motion scores (hard wins); the advantages are the
    group-normalised win rates computed here independently from the decoded clips."""
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    reward = {"rewards": {"motion": 1.0}, "pairwise": "motion", "win_mode": "hard"}
    trainer = Trainer(from_dict(_wan_cfg(wan_dir, tmp_path, reward, algorithm="pref_grpo")))
    seen = {}
    real = trainer.algorithm.advantages

    def spy(samples):
        adv, metrics = real(samples)
        seen["adv"] = adv.clone()
        return adv, metrics

    trainer.algorithm.advantages = spy
    trainer.train_iteration(0)
    scores = _motion(trainer.last_images).view(2, 3)
    win = torch.stack([(scores[:, [i]] > scores).double().sum(1) / 2 for i in range(3)], dim=1)
    centred = win - win.mean(1, keepdim=True)
    expected = centred / (win.std(1, unbiased=True, keepdim=True) + 1e-8)
    torch.testing.assert_close(seen["adv"].double().view(2, 3), expected, rtol=1e-5, atol=1e-5)


def test_judges_and_rewards_must_match_the_pipelines_modality(wan_dir, tmp_path):
    from diffusion_rl.config import from_dict
    from diffusion_rl.trainer import Trainer

    with pytest.raises(ConfigError, match=r"\['pairwise'\] cannot score the videos a wan pipeline.*video-frames"):
        Trainer(from_dict(_wan_cfg(wan_dir, tmp_path / "a", {"rewards": {"motion": 1.0}, "pairwise": "shapes-eval"},
                                   algorithm="pref_grpo")))
    with pytest.raises(RewardInputError, match="expected an image reward"):
        mmreward.load("video-frames", image_reward="motion")


# ------------------------------------------------------------------------------------------------
# card frame rate: a reward whose card samples by time keeps the frames its card asks for
# ------------------------------------------------------------------------------------------------
def test_qwen_vl_rate_rule_matches_hand_computed_indices():
    from mmreward.media import sample_frame_indices

    # 9 frames at 16 fps last 0.5625 s: 2 fps gives 1.1 frames, raised to Qwen-VL's minimum of 4
    assert sample_frame_indices(9, fps=2.0, source_fps=16.0, sampling="qwen-vl") == [0, 3, 5, 8]
    # 81 frames at 16 fps (Wan 2.1): 10.125 frames, rounded down to even 10, spread over 0..80
    assert sample_frame_indices(81, fps=2.0, source_fps=16.0, sampling="qwen-vl") == [
        0, 9, 18, 27, 36, 44, 53, 62, 71, 80]
    # 17 frames at 4 fps: 8.5 -> 8 frames of linspace(0, 16, 8)
    assert sample_frame_indices(17, fps=2.0, source_fps=4.0, sampling="qwen-vl") == [0, 2, 5, 7, 9, 11, 14, 16]
    # the plain rate rule keeps every (16 / 2) = 8th frame of the first int(17 / 8) = 2 steps
    assert sample_frame_indices(17, fps=2.0, source_fps=16.0) == [0, 8]


class _FrameSpy(mmreward.Reward):
    name = "frame-spy"
    modalities = ("video",)
    requires_prompt = False
    card_fps = 2.0
    card_fps_sampling = "qwen-vl"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def _score(self, prompts, media):
        self.seen.append(media.detach().clone())
        return mmreward.RewardOutput(media.mean(dim=(1, 2, 3, 4)))


def test_reward_with_a_card_rate_subsamples_clips_by_their_frame_rate():
    from mmreward.compose import WeightedSum

    clip = torch.rand(2, 17, 3, 8, 8)
    spy = _FrameSpy()
    spy.score(None, clip)  # no frame rate known: every frame
    assert spy.seen[-1].shape[1] == 17
    spy.score(None, clip, fps=4.0)
    assert torch.equal(spy.seen[-1], clip[:, [0, 2, 5, 7, 9, 11, 14, 16]])
    with pytest.raises(RewardInputError, match="fps"):
        spy.score(None, clip, fps=0)
    # a composite passes the rate to the rewards inside it
    inner = _FrameSpy()
    mix = WeightedSum({"spy": inner})
    mix.set_clip_fps(16.0)
    assert inner.clip_fps == 16.0
    mix.score(None, clip[:, :9])
    assert torch.equal(inner.seen[-1], clip[:, [0, 3, 5, 8]])


@pytest.fixture(scope="module")
def videoreward_fps_dir(videoreward_dir, tmp_path_factory):
    """The same tiny VideoReward with VideoReward's published card: fps 2.0, num_frames null."""
    import shutil

    folder = tmp_path_factory.mktemp("videoreward_fps") / "ckpt"
    shutil.copytree(videoreward_dir, folder)
    cfg = json.loads((folder / "model_config.json").read_text())
    cfg["data_config"]["num_frames"] = None
    (folder / "model_config.json").write_text(json.dumps(cfg))
    return folder


def test_videoalign_samples_a_wan_rollout_at_its_cards_2_fps(wan_pipe, videoreward_fps_dir, monkeypatch):
    """VideoReward's card says 2 frames per second (Qwen-VL's reader); the Wan adapter says its clips are 16
    fps, so a 9-frame rollout is 0.56 s: Qwen-VL's minimum of 4 frames, round(linspace(0, 8, 4))."""
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import check_reward_modalities, make_adapter
    from diffusion_rl.rollout import rollout
    from mmreward.backbones import qwen_vl

    reward = mmreward.load("videoalign", checkpoint=str(videoreward_fps_dir), min_pixels=28 * 28,
                           max_pixels=56 * 56)
    assert reward.num_frames is None and reward.card_fps == 2.0
    adapter = make_adapter(wan_pipe, H, W, 16, num_frames=9)
    check_reward_modalities(adapter, {"videoalign": reward})
    assert reward.clip_fps == adapter.fps == 16.0
    traj = rollout(adapter, adapter.encode(PROMPTS), [0, 1], [0, 0], num_steps=2, guidance_scale=1.0,
                   kernel=Kernel("flow_sde", 0.7), seed=0, epoch=0)
    seen = []
    real = qwen_vl.build_batch

    def spy(processor, texts, media, **kw):
        seen.extend(m.detach().clone() for m in media)
        return real(processor, texts, media, **kw)

    monkeypatch.setattr(qwen_vl, "build_batch", spy)
    reward.score(PROMPTS, traj.images)
    for clip, full in zip(seen, traj.images):
        assert torch.equal(clip, full[[0, 3, 5, 8]].to(clip.dtype))


def test_model_fps_sets_the_rate_rewards_see_and_is_an_error_for_images(wan_pipe, tmp_path):
    from diffusion_rl.config import ModelConfig
    from diffusion_rl.pipelines import adapter_for_config, check_reward_modalities
    from mmreward.testing.tiny_models import build_clip_tokenizer, build_tiny_pipeline

    spy = _FrameSpy()
    adapter = adapter_for_config(wan_pipe, ModelConfig(pretrained="x", height=H, width=W, num_frames=9))
    assert adapter.fps == 16.0  # Wan's own rate when the config says nothing
    adapter = adapter_for_config(wan_pipe, ModelConfig(pretrained="x", height=H, width=W, num_frames=9, fps=8.0))
    check_reward_modalities(adapter, {"spy": spy})
    assert adapter.fps == spy.clip_fps == 8.0
    with pytest.raises(ConfigError, match="model.fps"):
        ModelConfig(pretrained="x", fps=0)
    build_clip_tokenizer(tmp_path / "tok")
    image_pipe = build_tiny_pipeline("sd3", tmp_path / "tok")
    with pytest.raises(ConfigError, match="model.fps=8.0 .* makes images"):
        adapter_for_config(image_pipe, ModelConfig(pretrained="x", height=16, width=16, fps=8.0))
