"""End to end on ShapesWorld: the shipped configs raise held-out ShapesEval accuracy of the tiny generator.

Slow (the full runs take minutes); the default suite keeps a 1-iteration smoke run of each config.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "assets" / "shapesworld" / "generator"
CONFIGS = {"grpo": ROOT / "configs" / "shapes_grpo.yaml", "pref_grpo": ROOT / "configs" / "shapes_pref_grpo.yaml",
           "mixgrpo": ROOT / "configs" / "shapes_mixgrpo.yaml", "tempflow": ROOT / "configs" / "shapes_tempflow.yaml",
           "nft": ROOT / "configs" / "shapes_nft.yaml"}

needs_generator = pytest.mark.skipif(not (GENERATOR / "model_index.json").is_file(),
                                     reason="assets/shapesworld/generator is not built")


def _evals(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/shapes-eval/strict" in r]


@needs_generator
@pytest.mark.parametrize("algo", ["grpo", "pref_grpo", "nft", "mixgrpo", "tempflow"])
def test_shapesworld_config_smoke(algo, tmp_path):
    from diffusion_rl.cli import main

    out = tmp_path / algo
    small = ["train.iterations=1", "sample.prompts_per_iteration=2", "sample.group_size=2", "sample.batch_size=4",
             "train.micro_batch_size=4", "sample.num_steps=2", "sample.sde_window=[0, 1]", "sample.eval_num_steps=2",
             "train.num_minibatches=1", "prompts.eval_samples_per_prompt=1", "log.eval_every=0"]
    if algo in ("mixgrpo", "tempflow"):
        small.append("sample.sde_window_size=1")  # their sliding window must fit the smoke run's 1-step range
    assert main(["train", "--config", str(CONFIGS[algo]), *small, f"log.output_dir={out}", "log.progress=false"]) == 0
    evals = _evals(out)
    assert len(evals) == 2 and 0 <= evals[-1]["eval/shapes-eval/strict"] <= 1
    assert (out / "reward_curve.png").is_file() and (out / "eval_grid_end.png").is_file()


# the keys each method's comparison run may change against shapes_grpo (everything else is the shared budget,
# prompts, reward and evaluation); a key missing here that differs fails the test below
METHOD_KEYS = {
    "nft": {"sample.guidance_scale", "sample.sde_window", "sample.kernel", "sample.noise_level", "sample.ode_solver",
            "train.algorithm", "train.clip_range", "train.timestep_fraction", "train.timestep_selection", "train.kl_beta",
            "ppo.kl_mode", "train.max_grad_norm", "train.ema", "train.ema_decay", "train.ema_update_every"},
    "mixgrpo": {"sample.sde_window_size", "sample.sde_window_shift_every", "sample.share_initial_noise",
                "train.timestep_fraction", "train.timestep_selection"},
    "tempflow": {"sample.sde_window", "sample.sde_window_size", "sample.sde_window_shift_every",
                 "sample.share_initial_noise", "sample.branching", "train.timestep_fraction",
                 "train.timestep_selection", "ppo.noise_aware_weight"},
}


def _flat(cfg) -> dict:
    from dataclasses import asdict

    flat = {f"{section}.{k}": v for section, sub in asdict(cfg).items() if isinstance(sub, dict)
            for k, v in sub.items()}
    if flat["sample.eval_guidance_scale"] is None:  # None evaluates at the rollouts' scale
        flat["sample.eval_guidance_scale"] = flat["sample.guidance_scale"]
    return flat


@pytest.mark.parametrize("algo", sorted(METHOD_KEYS))
def test_shapesworld_comparison_configs_differ_from_grpo_only_in_method_keys(algo):
    """Same budget (672 generated images), prompts, reward and held-out evaluation as shapes_grpo."""
    from diffusion_rl.config import load_config

    grpo, other = _flat(load_config(CONFIGS["grpo"])), _flat(load_config(CONFIGS[algo]))
    differ = {k for k in grpo if grpo[k] != other[k] and k != "log.output_dir"}
    assert differ <= METHOD_KEYS[algo], f"{algo} differs from shapes_grpo outside its method keys: " + ", ".join(
        f"{k}: {grpo[k]!r} -> {other[k]!r}" for k in sorted(differ - METHOD_KEYS[algo]))
    images = other["train.iterations"] * other["sample.prompts_per_iteration"] * other["sample.group_size"]
    assert images == 14 * 6 * 8


# measured 2026-11-24 (README): on shapes_grpo's budget TempFlow-GRPO lowers held-out strict (colour binding)
# 0.604 -> 0.547 (0.180 with the paper's KL 0.004); strict xfail, so a change that makes it learn shows up
NOT_LEARNING = {"tempflow": "TempFlow-GRPO: held-out strict 0.604 -> 0.547 on the same 672 samples (README)"}


@needs_generator
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "pref_grpo", "nft", "mixgrpo"] + [
    pytest.param(algo, marks=pytest.mark.xfail(strict=True, reason=why)) for algo, why in NOT_LEARNING.items()])
def test_shapesworld_config_raises_held_out_accuracy(algo, tmp_path):
    from diffusion_rl.cli import main

    out = tmp_path / algo
    assert main(["train", "--config", str(CONFIGS[algo]), f"log.output_dir={out}", "log.progress=false"]) == 0
    evals = _evals(out)
    first, last = evals[0], evals[-1]
    for metric in ("strict", "partial"):
        key = f"eval/shapes-eval/{metric}"
        gain = last[key] - first[key]
        se = math.hypot(first[key + "_se"], last[key + "_se"])
        print(f"{algo} held-out {metric}: {first[key]:.3f} -> {last[key]:.3f} (gain {gain:+.3f}, {gain / se:.1f} SE)")
    # the done-when criterion on held-out strict accuracy (measured 2026-11-22 on the final generator:
    # GRPO 0.604 -> 0.773, +0.169, 5.1 SE; Pref-GRPO 0.604 -> 0.716, +0.112, 3.3 SE; 2026-11-24: DiffusionNFT
    # 0.604 -> 0.734, +0.130, 3.8 SE and MixGRPO 0.604 -> 0.729, +0.125, 3.7 SE on the same 672 samples);
    # the SE of the gain is the hypot of the two evaluations' SEs (unpaired, conservative: both evaluations share their x_T)
    key = "eval/shapes-eval/strict"
    gain = last[key] - first[key]
    assert gain >= 0.10, f"{algo}: held-out strict gain {gain:+.3f} < 0.10"
    assert gain >= 3 * math.hypot(first[key + "_se"], last[key + "_se"]), f"{algo}: gain {gain:+.3f} under 3 SE"
