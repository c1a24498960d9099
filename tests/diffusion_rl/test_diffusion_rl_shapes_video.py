"""End to end on moving ShapesWorld: GRPO (DanceGRPO preset, Flow-SDE on the first 2 steps, lr 1e-5) on the tiny
WanPipeline raises held-out motion accuracy.

Slow (the full run takes ~20 minutes on 2 CPU cores); the default suite keeps a 1-iteration smoke run of each config
and checks the training prompts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests._helpers.run_gains import gain, gain_text

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "assets" / "shapesworld" / "video-generator"
CONFIGS = {"checker": ROOT / "configs" / "shapes_video_grpo.yaml", "clip": ROOT / "configs" / "shapes_video_grpo_clip.yaml"}
KEY = "eval/shapes-video-eval/strict"

needs_generator = pytest.mark.skipif(not (GENERATOR / "model_index.json").is_file(),
                                     reason="assets/shapesworld/video-generator is not built")


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_gain_text_handles_metrics_without_spread():
    first = {"m": 0.393, "m_se": 0.025, "z": 0.0, "z_se": 0.0}
    last = {"m": 0.523, "m_se": 0.0255, "z": 0.0, "z_se": 0.0}
    g, se = gain(first, last, "m")
    assert g == pytest.approx(0.130) and se == pytest.approx(math.sqrt(0.025**2 + 0.0255**2))
    assert gain_text(first, last, "m") == "0.393 -> 0.523 (gain +0.130, 3.6 SE)"
    assert gain_text(first, last, "z") == "0.000 -> 0.000 (gain +0.000, no spread)"


@pytest.fixture(scope="module")
def generator(tmp_path_factory) -> Path:
    """The shipped video generator, or (not built yet) a 3-step one of the same architecture, 1 layer."""
    if (GENERATOR / "model_index.json").is_file():
        return GENERATOR
    from mmreward.synthetic.build import train_video_generator as tvg

    tmp = tmp_path_factory.mktemp("video-generator")
    return tvg.train(tvg.VideoGeneratorTrainConfig(out=str(tmp / "gen"), work=str(tmp / "work"), steps=3,
                                                   batch_size=2, layers=1, warmup=1))


@pytest.mark.parametrize("which", ["checker", "clip"])
def test_shapes_video_config_smoke(which, generator, tmp_path):
    import numpy as np
    from PIL import Image

    from diffusion_rl.cli import main

    out = tmp_path / which
    small = ["train.iterations=1", "sample.prompts_per_iteration=2", "sample.group_size=2", "sample.batch_size=4",
             "train.micro_batch_size=4", "sample.num_steps=2", "sample.sde_window=[0, 1]", "sample.eval_num_steps=2",
             "train.num_minibatches=1", "prompts.eval_samples_per_prompt=1", "log.eval_every=0",
             "log.max_grid_images=3", "prompts.eval=[a red triangle moving down at 2 pixels per frame, "
             "a white cross moving left at 1 pixel per frame, a blue square moving up at 2 pixels per frame]"]
    assert main(["train", "--config", str(CONFIGS[which]), *small, f"model.pretrained={generator}",
                 f"log.output_dir={out}", "log.progress=false"]) == 0
    rows = _rows(out)
    evals = [r for r in rows if KEY in r]
    assert len(evals) == 2 and all(0 <= r[KEY] <= 1 and 0 <= r["eval/shapes-video-eval/motion"] <= 1 for r in evals)
    train = [r for r in rows if "train/loss" in r]
    assert len(train) == 1 and math.isfinite(train[0]["train/loss"]) and train[0]["time/rollout_s"] > 0
    # the grids are clips: one row per prompt (3 prompts), its caption on the left, then the config's 4 frames
    # (32 px + 2 px border) of its clip; the clips also as a captioned GIF with one frame per video frame
    for grid in ("eval_grid_start.png", "eval_grid_end.png"):
        arr = np.array(Image.open(out / grid))
        assert arr.shape[0] == 3 * 34 and arr.shape[1] > 4 * 34 and arr.shape[2] == 3
        assert Image.open((out / grid).with_suffix(".gif")).n_frames == 4
    assert (out / "reward_curve.png").is_file()


@needs_generator
def test_training_prompts_are_held_out_pairs_disjoint_from_the_evaluation_prompts():
    from diffusion_rl.config import load_config
    from mmreward.synthetic.build.evaluate_video_generator import heldout_pair_prompts
    from mmreward.synthetic.motion import motion_is_held_out, parse_motion_prompt

    cfg = load_config(str(CONFIGS["checker"]), [])
    train, evals = cfg.prompts.load("train"), cfg.prompts.load("eval")
    assert len(train) == len(set(train)) == 24 and len(evals) == 24
    assert not set(train) & set(evals)
    pairs = set()
    for prompt in train + evals:
        spec = parse_motion_prompt(prompt)
        assert spec.num_objects == 1 and spec.objects[0].end_color is None and motion_is_held_out(spec), prompt
        pairs.add((spec.objects[0].color, spec.objects[0].shape))
    # the same held-out colour-shape pairs on both sides: RL sees the pairs, never the evaluated prompts
    assert {(parse_motion_prompt(p).objects[0].color, parse_motion_prompt(p).objects[0].shape) for p in train} == pairs
    # build_assets writes the file: every one-colour prompt of the held-out pairs that the recipe does not evaluate
    assert train == heldout_pair_prompts(evals) and len(train) + len(evals) == len(heldout_pair_prompts())


@needs_generator
@pytest.mark.slow
def test_shapes_video_grpo_raises_held_out_motion_accuracy(tmp_path):
    from diffusion_rl.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", str(CONFIGS["checker"]), f"log.output_dir={out}", "log.progress=false"]) == 0
    evals = [r for r in _rows(out) if KEY in r]
    first, last = evals[0], evals[-1]
    for metric in ("strict", "partial", "motion"):
        print(f"held-out {metric}: " + gain_text(first, last, f"eval/shapes-video-eval/{metric}"))
    # the done-when criterion, on held-out motion accuracy: >= 0.10 absolute and >= 3 SE (hypot of the two
    # evaluations' SEs: unpaired, conservative, since both evaluations share their initial noise)
    key = "eval/shapes-video-eval/motion"
    motion_gain, se = gain(first, last, key)
    assert motion_gain >= 0.10, f"held-out motion gain {motion_gain:+.3f} < 0.10"
    assert motion_gain >= 3 * se, f"gain {motion_gain:+.3f} under 3 SE ({se:.3f})"
