"""The tiny ShapesWorld edit model (a FluxKontextPipeline): trainer, build entry, and GRPO and DiffusionNFT on it
with the exact edit checker. Slow: the full runs of both configs and the shipped model's measurement; the default
suite keeps a quick build and a 1-iteration smoke run of each config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests._helpers.run_gains import gain, gain_text

ROOT = Path(__file__).resolve().parents[2]
EDIT_MODEL = ROOT / "assets" / "shapesworld" / "edit-model"
CONFIG = ROOT / "configs" / "shapes_edit_grpo.yaml"
NFT_CONFIG = ROOT / "configs" / "shapes_edit_nft.yaml"
needs_edit_model = pytest.mark.skipif(not (EDIT_MODEL / "model_index.json").is_file(),
                                      reason="assets/shapesworld/edit-model is not built")


@pytest.fixture(scope="module")
def quick_build(tmp_path_factory):
    from mmreward.synthetic.build.build_assets import main

    root = tmp_path_factory.mktemp("edit_assets")
    main(["--only", "edit-model", "--quick", "--root", str(root), "--work", str(root / "work"), "--threads", "1"])
    return root / "edit-model"


def test_training_forward_is_the_kontext_pipelines_denoiser(tmp_path):
    """One Euler step from sigma 1 is x_0 = eps - v(eps, 1): the trainer's conditioning (packed source tokens with
    image ids, text ids, timestep scale) must be exactly what FluxKontextPipeline feeds the transformer."""
    from mmreward.synthetic.build.train_edit_model import (
        GENERATION_DEFAULTS,
        EditTrainConfig,
        build_pipeline,
        pack,
        velocity,
    )
    from mmreward.synthetic.edits import render_edit_targets, sample_edit_tasks

    torch.set_num_threads(1)
    pipe = build_pipeline(EditTrainConfig(heads=1, layers=1, single_layers=1), tmp_path / "tok")
    pipe.set_progress_bar_config(disable=True)
    for m in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2):
        m.eval()  # as from_pretrained loads them: T5's dropout off
    tasks = sample_edit_tasks(2, seed=3)
    src, _ = render_edit_targets(tasks)
    src = src * 2 - 1
    instructions = [t.instruction for t in tasks]
    noise = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    packed = pack(pipe, noise)
    with torch.no_grad():
        got = pipe(image=src, prompt=instructions, latents=packed, output_type="pt",
                   **{**GENERATION_DEFAULTS, "num_inference_steps": 1}).images
        v = velocity(pipe, instructions, src, packed, torch.ones(2), GENERATION_DEFAULTS["max_sequence_length"])
        v_other = velocity(pipe, instructions, src.flip(0), packed, torch.ones(2), 16)
    x0 = pipe._unpack_latents(packed - v, 32, 32, pipe.vae_scale_factor)
    want = (x0 / 2 + 0.5).clamp(0, 1)
    assert got.shape == (2, 3, 32, 32)
    # the identity VAE is exact to ~1e-6 of the pixel range; fp32 reordering adds less
    assert (got - want).abs().max() <= 1e-4
    assert (v - v_other).abs().max() > 1e-3  # the source is part of the condition


def test_edit_train_config_rejects_bad_values():
    from mmreward.errors import ConfigError
    from mmreward.synthetic.build.train_edit_model import EditTrainConfig

    with pytest.raises(ConfigError, match="steps"):
        EditTrainConfig(steps=0)
    with pytest.raises(ConfigError, match="ema"):
        EditTrainConfig(ema=1.0)


def test_quick_build_writes_a_loadable_kontext_pipeline_metrics_and_prompt_sets(quick_build):
    from diffusers import FluxKontextPipeline

    from mmreward.synthetic.edits import sample_edit_tasks

    pipe = FluxKontextPipeline.from_pretrained(str(quick_build))
    assert pipe.transformer.config.in_channels == 12 and pipe.vae_scale_factor == 1  # 2x2 pixel patches
    metrics = json.loads((quick_build / "metrics.json").read_text())
    for split in ("heldout", "train"):
        assert metrics[split]["n"] == 4 and 0 <= metrics[split]["partial"] <= 1
    assert "| heldout | 4 |" in (quick_build / "README.md").read_text()
    rows = {s: [json.loads(x) for x in (quick_build / "prompts" / s / "edits.jsonl").read_text().splitlines()]
            for s in ("train", "heldout")}
    assert len(rows["train"]) == 96 and {r["split"] for r in rows["train"]} == {"train"}
    assert len(rows["heldout"]) == 64 and {r["split"] for r in rows["heldout"]} == {"heldout"}
    # the held-out records are the tasks the evaluator measures first (seed 1)
    assert [r["instruction"] for r in rows["heldout"]] == [t.instruction for t in sample_edit_tasks(64, 1, "heldout")]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _evals(out: Path) -> list[dict]:
    return [r for r in _rows(out) if "eval/shapes-edit-eval/strict" in r]


def _heldout_subset(model: Path, out: Path, per_kind: int = 3) -> Path:
    """The first `per_kind` held-out edits of each kind (color, shape, add) with their source images: a smoke run
    evaluates every kind of edit and reports every clause without sampling all 64 edits twice."""
    src = model / "prompts" / "heldout"
    rows, seen = [], {}
    for line in (src / "edits.jsonl").read_text().splitlines():
        kind = json.loads(line)["edit"]["kind"]
        if seen.get(kind, 0) < per_kind:
            seen[kind] = seen.get(kind, 0) + 1
            rows.append(line)
    assert set(seen) == {"color", "shape", "add"}, seen
    (out / "sources").mkdir(parents=True)
    for line in rows:
        name = json.loads(line)["source_image"]
        (out / name).write_bytes((src / name).read_bytes())
    (out / "edits.jsonl").write_text("\n".join(rows) + "\n")
    return out / "edits.jsonl"


def _smoke_overrides(model: Path, tmp: Path) -> list[str]:
    """A 1-iteration run of an edit config on `model` (a built edit-model folder, with its edit records)."""
    return ["train.iterations=1", "sample.prompts_per_iteration=2", "sample.group_size=2", "sample.batch_size=4",
            "train.micro_batch_size=4", "sample.num_steps=2", "sample.eval_num_steps=2", "train.num_minibatches=1",
            "prompts.eval_samples_per_prompt=1", "log.eval_every=0", f"model.pretrained={model}",
            f"prompts.train={model / 'prompts/train/edits.jsonl'}",
            f"prompts.eval={_heldout_subset(model, tmp / 'heldout')}"]


def test_shapes_edit_grpo_config_smoke(quick_build, tmp_path):
    from diffusion_rl.cli import main

    out = tmp_path / "run"
    small = [*_smoke_overrides(quick_build, tmp_path), "sample.sde_window=[0, 1]"]
    assert main(["train", "--config", str(CONFIG), *small, f"log.output_dir={out}", "log.progress=false"]) == 0
    evals = _evals(out)
    assert len(evals) == 2
    for row in evals:  # held-out edits of each kind, each clause reported
        assert 0 <= row["eval/shapes-edit-eval/strict"] <= row["eval/shapes-edit-eval/partial"] <= 1
        assert "eval/shapes-edit-eval/background" in row


@needs_edit_model
def test_shapes_edit_nft_config_smoke(tmp_path):
    """One DiffusionNFT iteration of the shipped edit config on the shipped edit model (the quick build never edits,
    so its rewards are all 0, every r is 1/2 and NFT's gradient vanishes): it trains on the edit records (the
    source is in the condition), moves the weights, and evaluates every clause."""
    from safetensors.torch import load_file

    from diffusion_rl.cli import main

    out = tmp_path / "run"
    # the model's 8 steps (fewer ones make no correct edits, so no reward spread); 2 of them trained (the config
    # trains 7: each costs a policy and a reference pass over the 8 samples, the bulk of this test's time)
    small = [*_smoke_overrides(EDIT_MODEL, tmp_path), "sample.num_steps=8", "sample.group_size=4", "sample.batch_size=8",
             "train.micro_batch_size=8", "train.timestep_fraction=0.25"]
    assert main(["train", "--config", str(NFT_CONFIG), *small, f"log.output_dir={out}", "log.progress=false"]) == 0
    train = [r for r in _rows(out) if "train/loss" in r]
    assert len(train) == 1 and torch.isfinite(torch.tensor(train[0]["train/loss"]))
    assert train[0]["reward/shapes-edit-eval_std"] > 0, "no reward spread: the step below would not test anything"
    assert len(_evals(out)) == 2
    before = load_file(next((EDIT_MODEL / "transformer").glob("*.safetensors")))
    after = load_file(next((out / "final" / "transformer").glob("*.safetensors")))
    assert before.keys() == after.keys()
    moved = max((after[k].float() - before[k].float()).abs().max().item() for k in before)
    assert moved > 1e-6, "one NFT step on rewards with spread left the weights unchanged"


@needs_edit_model
@pytest.mark.slow
def test_shipped_edit_model_reproduces_its_card(tmp_path):
    from mmreward.synthetic.build.evaluate_edit_model import evaluate, load_edit_model

    card = json.loads((EDIT_MODEL / "metrics.json").read_text())
    got = evaluate(load_edit_model(EDIT_MODEL), card["heldout"]["n"])
    for split in ("heldout", "train"):  # same tasks, same seeded noise: equal up to float reordering
        assert got[split]["partial"] == pytest.approx(card[split]["partial"], abs=2 * card[split]["partial_se"])


def _assert_edit_bar(config: Path, out: Path) -> None:
    """Train `config` to its end and assert the issue's bar on the held-out edits: the edit clause (the requested
    change is there) up by >= 0.10 and >= 3 SE (the hypot of the two evaluations' SEs), and strict accuracy up."""
    from diffusion_rl.cli import main

    assert main(["train", "--config", str(config), f"log.output_dir={out}", "log.progress=false"]) == 0
    evals = _evals(out)
    first, last = evals[0], evals[-1]
    gains = {}
    for clause in ("strict", "partial", "edit", "preserved", "no_extra", "background"):
        key = f"eval/shapes-edit-eval/{clause}"
        gains[clause] = gain(first, last, key)
        print(f"held-out {clause}: " + gain_text(first, last, key))
    edit_gain, se = gains["edit"]
    assert edit_gain >= 0.10, f"held-out edit-clause gain {edit_gain:+.3f} < 0.10"
    assert edit_gain >= 3 * se, f"gain {edit_gain:+.3f} under 3 SE ({se:.3f})"
    assert gains["strict"][0] > 0, "the edits got more often right but strict accuracy did not rise"


@needs_edit_model
@pytest.mark.slow
def test_shapes_edit_nft_raises_held_out_edit_accuracy(tmp_path):
    _assert_edit_bar(NFT_CONFIG, tmp_path / "run")


@needs_edit_model
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="measured 2026-11-27: held-out edit clause 0.238 -> 0.297 (+0.059, 1.5 SE) "
                   "after 160 iterations; GRPO does not reach the issue's bar (+0.10 and 3 SE; README, Image editing)")
def test_shapes_edit_grpo_raises_held_out_edit_accuracy(tmp_path):
    _assert_edit_bar(CONFIG, tmp_path / "run")
