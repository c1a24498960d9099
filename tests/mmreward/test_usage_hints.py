"""Errors that name the fix (issue 28 items 9 and 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import mmreward
from diffusion_rl.config import load_config
from mmreward.errors import ConfigError, MediaError

REPO = Path(__file__).resolve().parents[2]


def test_a_video_given_to_an_image_reward_names_video_frames(tmp_path):
    """Not 'cannot read image ... (is the file corrupt?)': the reward is image-only, and video-frames is the fix."""
    import numpy as np

    av = pytest.importorskip("av")
    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for _ in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 128, np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    reward = mmreward.load("jpeg-compressibility")
    with pytest.raises(MediaError, match=r"is a video.*images only.*video-frames") as info:
        reward.score("a clip", [str(path)])
    assert "corrupt" not in str(info.value)
    # the suggested wrapper does score it
    frames = mmreward.load("video-frames", image_reward="jpeg-compressibility", num_frames=2)
    assert frames.score("a clip", [str(path)]).scores.shape == (1,)


def test_overriding_reward_rewards_says_how_to_clear_the_options(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"reward": {"rewards": {"shapes-eval": 1.0},
                                               "options": {"shapes-eval": {"mode": "partial"}}}}))
    with pytest.raises(ConfigError, match=r"not used: \['shapes-eval'\].*reward\.options='\{\}'"):
        load_config(path, ["reward.rewards={mock: 1.0}"])
    cfg = load_config(path, ["reward.rewards={mock: 1.0}", "reward.options={}"])
    assert cfg.reward.rewards == {"mock": 1.0} and cfg.reward.options == {}
