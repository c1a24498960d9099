"""Recipes in configs/: each resolves offline (`diffusion-rl config --check`), each real-model recipe trains one
iteration with the tiny pipeline of its family substituted; no default reward; `--help-keys` lists every key;
inputs named in a YAML file resolve against the file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from diffusion_rl.cli import main
from diffusion_rl.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs").glob("*.yaml"))
REAL = [p for p in RECIPES if not p.name.startswith("shapes_")]
RESULT_CONFIGS = sorted((ROOT / "docs" / "results").glob("*/configs/*.yaml"))  # configs of documented runs
# the model family of each real model id the recipes use (what the tiny substitute must match)
FAMILY = {"stabilityai/stable-diffusion-3.5-medium": "sd3", "black-forest-labs/FLUX.1-dev": "flux",
          "stable-diffusion-v1-5/stable-diffusion-v1-5": "sd", "stabilityai/stable-diffusion-xl-base-1.0": "sdxl",
          "hunyuanvideo-community/HunyuanVideo": "hunyuan_video", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": "wan",
          "THUDM/CogVideoX-2b": "cogvideox", "Lightricks/LTX-Video": "ltx",
          "black-forest-labs/FLUX.2-klein-9B": "flux2_klein", "Tongyi-MAI/Z-Image-Turbo": "z_image",
          "Qwen/Qwen-Image-2512": "qwen_image", "black-forest-labs/FLUX.2-dev": "flux2",
          # Wan 2.2 A14B: the same WanPipeline class as Wan 2.1, with transformer_2 (its own tiny builder and adapter)
          "Wan-AI/Wan2.2-T2V-A14B-Diffusers": "wan22", "Wan-AI/Wan2.2-I2V-A14B-Diffusers": "wan_i2v",
          "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v": "hunyuan_video15", "Lightricks/LTX-2": "ltx2",
          "Qwen/Qwen-Image-2.1": "qwen_image21"}
VIDEO = {"hunyuan_video", "wan", "cogvideox", "ltx", "wan22", "wan_i2v", "hunyuan_video15", "ltx2"}
# the tiny pipelines' geometry where it differs from the default 5 frames of 32 x 32 (VAE factors of each builder)
TINY_VIDEO = {"ltx": (9, 32), "wan22": (9, 32), "wan_i2v": (9, 32), "hunyuan_video15": (5, 16), "ltx2": (9, 32)}
# text tokens the tiny text encoders take (their templates and position tables)
TINY_MSL = {"sd3": 8, "flux": 8, "cogvideox": 16, "flux2": 48, "wan22": 16, "wan_i2v": 16, "hunyuan_video15": 24,
            "ltx2": 16}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_recipes_cover_the_published_methods():
    assert len(REAL) >= 8
    for path in REAL:
        raw = _raw(path)
        assert raw["model"]["pretrained"] in FAMILY, f"{path.name}: a real hub id"
        assert raw["reward"]["rewards"], path.name
        assert "Source:" in path.read_text(), f"{path.name} must cite where its settings come from"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_passes_check(recipe, tmp_path, capsys, monkeypatch):
    """`config --check` from another directory, as on a fresh clone: shipped prompt files are read, published
    sets are pinned references fetched at the first run (never by --check; see tests/diffusion_rl/test_prompt_data.py)."""
    from mmreward import published_data

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(published_data.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(published_data, "_open_url", lambda url: pytest.fail(f"--check downloaded {url}"))
    raw = _raw(recipe)
    procs = "1" if recipe.name.startswith("shapes_") else "8"  # the real recipes are laid out for 8 GPUs
    code = main(["config", "--config", str(recipe), "--check", "--num-processes", procs])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("OK ") and "rewards" in out.out
    for name in raw["reward"]["rewards"]:
        assert name in out.out


@pytest.mark.parametrize("config", RESULT_CONFIGS, ids=lambda p: p.parent.parent.name + "/" + p.name)
def test_configs_of_documented_runs_pass_check(config, tmp_path, capsys, monkeypatch):
    """The configs a results page cites still load and check from another directory (their paths are relative)."""
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--config", str(config), "--check", "--num-processes", "1"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("OK ")


@pytest.fixture(scope="module")
def tiny_family_dirs(tmp_path_factory):
    from mmreward.testing.tiny_models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("recipe_pipes")
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache and family == "flux2_klein":  # the step-distilled klein (own builder)
            from mmreward.testing.tiny_flux2 import save_tiny_flux2

            cache[family] = save_tiny_flux2(root / family, "klein_distilled")
        if family not in cache and family == "qwen_image":  # QwenImagePipeline (own builder)
            from mmreward.testing.tiny_qwen_image import save_tiny_qwen_image_pipeline

            cache[family] = save_tiny_qwen_image_pipeline(root / family)
        if family not in cache and family == "z_image":  # ZImagePipeline (own builder)
            from mmreward.testing.tiny_z_image import save_tiny_z_image_pipeline

            cache[family] = save_tiny_z_image_pipeline(root / family)
        if family not in cache and family == "flux2":  # Flux2Pipeline (FLUX.2-dev: guidance embedding)
            from mmreward.testing.tiny_flux2 import save_tiny_flux2

            cache[family] = save_tiny_flux2(root / family, "dev")
        if family not in cache and family in ("wan22", "wan_i2v"):  # two experts (and the first-frame condition)
            from mmreward.testing.tiny_wan22 import save_tiny_wan22

            cache[family] = save_tiny_wan22("t2v" if family == "wan22" else "i2v", root / family)
        if family not in cache and family == "hunyuan_video15":
            from mmreward.testing.tiny_hunyuan_video15 import save_tiny_hunyuan_video15

            cache[family] = save_tiny_hunyuan_video15(root / family)
        if family not in cache and family == "qwen_image21":  # QwenImage21Pipeline (own builder)
            from mmreward.testing.tiny_qwen_image21 import save_tiny_qwen_image21_pipeline

            cache[family] = save_tiny_qwen_image21_pipeline(root / family)
        if family not in cache and family == "ltx2":
            from mmreward.testing.tiny_ltx2 import save_tiny_ltx2_pipeline

            cache[family] = save_tiny_ltx2_pipeline(root / family)
        if family not in cache:
            cache[family] = Path(save_tiny_pipeline(family, root / family))
        return cache[family]

    return get


def _shrink(recipe: Path, tiny: Path, family: str, out: Path) -> list[str]:
    """Overrides that keep the recipe's method and swap in the tiny model, the mock reward and tiny batches."""
    raw = _raw(recipe)
    algorithm = load_config(recipe, ["reward.rewards={mock: 1}", "reward.options={}", "reward.pairwise=null",
                                     "reward.eval_rewards=null"]).train.algorithm
    ddpo = algorithm == "ddpo"
    o = [f"model.pretrained={tiny}", "model.dtype=float32", "train.mixed_precision='no'", "model.height=16",
         "model.width=16", "model.lora_rank=4", "model.lora_alpha=4", "sample.num_steps=4", "sample.eval_num_steps=2",
         f"sample.prompts_per_iteration={4 if ddpo else 2}", f"sample.group_size={1 if ddpo else 2}",
         "sample.batch_size=4", "train.micro_batch_size=2", "train.iterations=1", "train.probe=error",
         "train.learning_rate=1e-2", "train.max_grad_norm=1.0", "reward.rewards={mock: 1.0}", "reward.options={}",
         "reward.eval_rewards=null", "reward.pairwise=" + ("mock" if algorithm == "pref_grpo" else "null"),
         "prompts.eval=null",
         "advantage.min_count=16", "train.num_minibatches=2" if ddpo else "train.num_minibatches=1",
         f"log.output_dir={out}", "log.progress=false", "log.grid_every=0", "log.eval_every=0"]
    # DDPO's stat tracker needs repeats of a prompt to give non-zero advantages in one iteration; an image-to-video
    # recipe keeps its own edit records (each row's source image is the first frame)
    if family != "wan_i2v":
        o.append("prompts.train=" + ("[a cat]" if ddpo else "[a red circle, a blue square]"))
    if family in TINY_MSL:  # the tiny text encoder's length
        o.append(f"model.max_sequence_length={TINY_MSL[family]}")
    if family == "qwen_image21":  # sizes are multiples of 32 (the VAE's 16 x the 2x2 image-slot groups)
        o += ["model.height=32", "model.width=32"]
    if family in VIDEO:  # short clips on the VAE grid, scored by a video reward
        frames, size = TINY_VIDEO.get(family, (5, 32))
        o += [f"model.num_frames={frames}", f"model.height={size}", f"model.width={size}",
              "reward.rewards={motion: 1.0}", "ppo.best_worst_k=0"]
    if "sde_window" in str(raw) or "fast" in recipe.name:
        o += ["sample.sde_window=[0, 2]", "sample.sde_window_size=1"]
    return o


@pytest.mark.parametrize("recipe", REAL, ids=lambda p: p.name)
def test_real_recipe_trains_one_iteration_with_the_tiny_pipeline_of_its_family(recipe, tiny_family_dirs, tmp_path):
    from diffusion_rl.pipelines import ADAPTERS
    from diffusion_rl.trainer import Trainer

    family = FAMILY[_raw(recipe)["model"]["pretrained"]]
    full = load_config(recipe, ["reward.rewards={mock: 1}", "reward.options={}", "reward.pairwise=null",
                                "reward.eval_rewards=null", "prompts.train=[a]", "prompts.eval=null"])
    cfg = load_config(recipe, _shrink(recipe, tiny_family_dirs(family), family, tmp_path / "out"))
    # the method's settings are the recipe's: only sizes, the model and the reward were swapped
    for section, keys in {"train": ["algorithm", "clip_range", "kl_beta", "timestep_fraction", "timestep_selection",
                                    "ema"],
                          "ppo": ["kl_mode", "ratio_norm"], "draft": ["backprop_steps"],
                          "sample": ["kernel", "noise_level", "guidance_scale", "share_initial_noise"],
                          "model": ["lora"], "advantage": ["std_scope", "unbiased"]}.items():
        for key in keys:
            assert getattr(getattr(cfg, section), key) == getattr(getattr(full, section), key), f"{section}.{key}"
    trainer = Trainer(cfg)
    from diffusion_rl.adapters.wan22 import Wan22Adapter
    from diffusion_rl.video_adapters import VIDEO_ADAPTERS

    # a two-expert WanPipeline is served by Wan22Adapter (WanAdapter hands it over), under the family name "wan"
    assert type(trainer.adapter) is {**ADAPTERS, **VIDEO_ADAPTERS, "wan22": Wan22Adapter}[family]
    if family in ("wan22", "wan_i2v"):  # the recipe's expert choice reached the adapter
        assert trainer.adapter.lora_experts == cfg.model.lora_experts and trainer.adapter.boundary_ratio is not None
        experts = trainer.adapter.denoiser
        trained = {name for name in ("high", "low")
                   if any(q.requires_grad for q in getattr(experts, name).parameters())}
        assert trained == ({"high", "low"} if cfg.model.lora_experts == "both" else {cfg.model.lora_experts})
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    changed = sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))
    assert changed > 0, "the update did not move any trained parameter"


def test_a_config_without_a_reward_is_an_error_not_mock(tmp_path, capsys, tiny_pipeline_dir):
    path = tmp_path / "no_reward.yaml"
    path.write_text(yaml.safe_dump({"model": {"pretrained": str(tiny_pipeline_dir("sd3"))},
                                    "prompts": {"train": ["a cat"]}, "log": {"output_dir": str(tmp_path / "o")}}))
    capsys.readouterr()  # the fixture's progress output
    for argv in (["config", "--config", str(path), "--check"], ["train", "--config", str(path)],
                 ["config", "--preset", "flow_grpo"]):
        assert main(argv) == 2
        line = _one_line_error(capsys)
        assert "reward.rewards is not set" in line and "mmreward list" in line
    assert main(["config", "--config", str(path), "--check", "reward.rewards={mock: 1}"]) == 0


def test_help_keys_lists_every_field_with_type_default_and_help(capsys):
    assert main(["config", "--help-keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines if line.strip()}
    expected = {"preset"}
    for section in dataclasses.fields(RunConfig):
        if section.name == "preset":
            continue
        for f in dataclasses.fields(section.default_factory):  # the section's dataclass
            key = f"{section.name}.{f.name}"
            expected.add(key)
            assert key in rows, key
            assert f.metadata["help"] in rows[key], key
            if f.default is not dataclasses.MISSING and not f.metadata.get("required"):
                assert repr(f.default) in rows[key], key
    assert set(rows) == expected
    assert "(required)" in rows["reward.rewards"] and "float" in rows["train.learning_rate"]


def test_yaml_inputs_resolve_against_the_file_outputs_against_the_cwd(tmp_path, capsys, monkeypatch,
                                                                      tiny_pipeline_dir):
    sub = tmp_path / "project" / "recipes"
    sub.mkdir(parents=True)
    (sub / "prompts.txt").write_text("a red circle\na blue square\na green star\n")
    (tmp_path / "project" / "pipe").symlink_to(tiny_pipeline_dir("sd"), target_is_directory=True)
    (sub / "run.yaml").write_text(yaml.safe_dump({
        "model": {"pretrained": "../pipe"}, "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": "prompts.txt", "eval": "prompts.txt"},
        "log": {"output_dir": "runs/x"}, "sample": {"kernel": "ddim", "noise_level": 1.0}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["config", "--config", "../project/recipes/run.yaml", "--check"]) == 0
    out = capsys.readouterr().out
    assert "train: 3 prompts; eval: 3 prompts" in out and "sd (StableDiffusionPipeline, local folder)" in out
    cfg = load_config("../project/recipes/run.yaml")
    assert Path(cfg.prompts.train) == (sub / "prompts.txt").resolve()
    assert cfg.prompts.load("train") == ["a red circle", "a blue square", "a green star"]
    assert cfg.log.output_dir == "runs/x"  # an output: where the user runs, not next to the recipe
    # values on the command line are relative to the current directory
    (elsewhere / "mine.txt").write_text("a cat\n")
    assert load_config("../project/recipes/run.yaml", ["prompts.train=mine.txt"]).prompts.load("train") == ["a cat"]
    # a hub id that happens not to exist next to the file stays a hub id
    hub = load_config("../project/recipes/run.yaml", []).model.pretrained
    assert Path(hub).resolve() == (tmp_path / "project" / "pipe").resolve()
    (sub / "hub.yaml").write_text(yaml.safe_dump({"model": {"pretrained": "org/model"},
                                                  "reward": {"rewards": {"mock": 1.0}}}))
    assert load_config(sub / "hub.yaml").model.pretrained == "org/model"


def test_check_reports_what_a_run_would_fail_on(tmp_path, capsys, tiny_pipeline_dir):
    base = tmp_path / "run.yaml"
    base.write_text(yaml.safe_dump({"model": {"pretrained": str(tiny_pipeline_dir("sd3"))},
                                    "reward": {"rewards": {"mock": 1.0}}, "prompts": {"train": ["a cat"]}}))
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "model_index.json").write_text(json.dumps({"_class_name": "PixArtSigmaPipeline"}))
    capsys.readouterr()
    cases = {
        "reward.rewards={nopescore: 1}": "nopescore",
        "reward.options={aesthetic: {bogus: 1}}": "bogus",
        f"model.pretrained={qwen}": "PixArtSigmaPipeline",  # a diffusers class no adapter serves
        "model.pretrained=not a hub id": "neither a local folder nor",
        f"model.pretrained={tmp_path / 'missing'}": "does not exist",
    }
    for override, match in cases.items():
        extra = ["reward.rewards={aesthetic: 1}"] if "aesthetic" in override else []
        assert main(["config", "--config", str(base), "--check", *extra, override]) == 2, override
        assert match in _one_line_error(capsys), override
    assert main(["config", "--config", str(base), "--check", "--num-processes", "3",
                 "sample.prompts_per_iteration=4"]) == 2
    assert "divisible by the number of processes (3)" in _one_line_error(capsys)


@pytest.mark.parametrize("recipe, reward, needs", [
    ("flow_grpo_sd35_geneval.yaml", "geneval", "Mask2Former"),
    ("flow_grpo_fast_sd35_geneval.yaml", "geneval", "Mask2Former"),
    ("flow_grpo_sd35_ocr.yaml", "ocr", "PaddleOCR 2.9.1"),
])
def test_flow_grpo_recipes_use_the_papers_rewards_and_say_which_weights_to_supply(recipe, reward, needs, capsys):
    """Flow-GRPO trained on GenEval's Mask2Former + CLIP colours (dense score) and PaddleOCR 2.9.1 English (issue 34)."""
    from diffusion_rl.cli import main

    raw = _raw(ROOT / "configs" / recipe)
    opts = raw["reward"]["options"][reward]
    if reward == "geneval":
        assert (opts["score"], opts["detector"], opts["colors"], opts["detector_options"]) == (
            "dense", "mask2former", "clip", {"swap_rb": True})
    else:
        assert opts == {"preset": "flow_grpo"}
    assert main(["config", "--config", str(ROOT / "configs" / recipe), "--check"]) == 0
    out = capsys.readouterr().out
    assert "NEEDS" in out and needs in out and f"reward.options.{reward}.checkpoint=PATH" in out
