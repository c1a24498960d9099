"""Pipeline folders' card defaults are read wherever a pipeline is loaded (issue 28 item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffusion_rl.model_card import read_generation_defaults
from diffusion_rl.pipelines import load_pipeline, make_adapter
from mmreward.errors import CheckpointError, ConfigError

REPO = Path(__file__).resolve().parents[2]
VIDEO = REPO / "assets" / "shapesworld" / "video-generator"


def test_card_defaults_are_read_and_checked(tmp_path):
    gd = read_generation_defaults(VIDEO)
    card = json.loads((VIDEO / "shapesworld.json").read_text())["generation_defaults"]
    assert gd == {k: card[k] for k in ("height", "width", "num_frames", "max_sequence_length",
                                       "num_inference_steps", "guidance_scale")}
    assert read_generation_defaults("org/hub-id") == {}
    (tmp_path / "shapesworld.json").write_text('{"generation_defaults": {"height": "tall"}}')
    with pytest.raises(CheckpointError, match="height must be a number"):
        read_generation_defaults(tmp_path)


def test_adapter_takes_the_video_cards_geometry_and_refuses_too_many_tokens():
    pipe = load_pipeline(str(VIDEO))
    adapter = make_adapter(pipe)  # nothing given: the card's 32x32, 4 frames, 20 tokens
    assert (adapter.height, adapter.width, adapter.num_frames) == (32, 32, 4)
    assert adapter.max_sequence_length == 20
    explicit = make_adapter(pipe, num_frames=2)  # what the user sets wins
    assert explicit.num_frames == 2
    with pytest.raises(ConfigError, match=r"max_sequence_length=226 .*77 positions"):
        make_adapter(pipe, max_sequence_length=226)


def test_best_of_n_on_the_shipped_video_generator_needs_no_geometry_flags(tmp_path, capsys):
    """It died with max_position_embeddings (226 > 77) and a reshape error unless given four flags."""
    from diffusion_rl.cli import main

    out = tmp_path / "bon"
    rc = main(["best-of-n", "--pipeline", str(VIDEO), "--reward", "motion=1", "--prompt",
               "a red circle moving left at 1 pixel per frame", "--n", "2", "--output", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    import av

    with av.open(str(out / "best_000.mp4")) as clip:
        frames = [f for f in clip.decode(video=0)]
    assert len(frames) == 4 and (frames[0].width, frames[0].height) == (32, 32)
    capsys.readouterr()
    rc = main(["best-of-n", "--pipeline", str(VIDEO), "--reward", "motion=1", "--prompt", "a red circle",
               "--max-sequence-length", "226", "--output", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "max_sequence_length=226" in err.strip().splitlines()[-1]
