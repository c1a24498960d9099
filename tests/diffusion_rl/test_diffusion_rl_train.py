"""Trainer: one-iteration smoke runs of every algorithm on tiny SD (UNet), SD3 and FLUX pipelines, exact
resume, the correctness probe, configs and the CLI, and 2-process data parallel == 1 process."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from diffusion_rl.checkpointing import read_checkpoint
from diffusion_rl.config import TrainConfig, from_dict, load_config, parse_overrides
from diffusion_rl.ratio_probe import ProbeError
from diffusion_rl.trainer import Trainer
from mmreward.errors import CheckpointError, ConfigError

PROMPTS = ["a red circle", "a blue square", "a green star"]


@pytest.fixture(scope="module")
def pipes(tiny_pipeline_dir):
    """The session's tiny SD, SD3 and FLUX pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return {k: str(tiny_pipeline_dir(k)) for k in ("sd", "sd3", "flux")}


def _cfg(pipe_dir: str, kind: str, algo: str, out: Path, **train) -> dict:
    flow = kind != "sd"
    return {
        "model": {"pretrained": pipe_dir, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": None if kind == "sd" else 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde" if flow else "ddim",
                   "noise_level": 0.7 if flow else 1.0, "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": algo, "iterations": 1, "learning_rate": 1e-2, "probe": "error", "timestep_fraction": 0.5,
                  "kl_beta": 0.01 if algo == "grpo" else 0.0, **train},
        "ppo": {"ratio_norm": algo == "pref_grpo"},
        "advantage": {"per_prompt_tracking": algo == "ddpo", "min_count": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.mark.parametrize("kind", ["sd", "sd3", "flux"])
@pytest.mark.parametrize("algo", ["grpo", "pref_grpo", "ddpo"])
def test_one_iteration_smoke(pipes, tmp_path, kind, algo):
    trainer = Trainer(from_dict(_cfg(pipes[kind], kind, algo, tmp_path)))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert metrics["train/probe/max_abs_log_ratio"] < 1e-5  # the first ratio is 1 up to float noise
    changed = sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable))
    assert changed > 0, "the update did not move any trained parameter"
    assert metrics["adv/abs_mean"] > 0


def _without_times(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


@pytest.mark.parametrize("kind,algo", [("sd3", "grpo"), ("sd", "ddpo")])
def test_exact_resume_and_outputs(pipes, tmp_path, kind, algo):
    """A resumed run is bit-identical to the uninterrupted one: parameters, EMA and every metric."""
    def cfg(out, **kw):
        c = _cfg(pipes[kind], kind, algo, out, ema=True, ema_update_every=1, **kw)
        c["prompts"]["train"] = PROMPTS + ["a yellow triangle", "a purple heart"]  # prompts first seen in iteration 2
        return from_dict(c)

    straight = Trainer(cfg(tmp_path / "a", iterations=2))
    straight.fit()
    first = Trainer(cfg(tmp_path / "b", iterations=1))
    first.fit()
    ckpt = tmp_path / "b" / "checkpoints" / "iter_000001"
    resumed = Trainer(cfg(tmp_path / "b", iterations=2, resume_from=str(ckpt)))
    assert resumed.iteration == 1
    resumed.fit()
    for a, b in zip(straight.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight.ema.shadow, resumed.ema.shadow, strict=True):
        assert torch.equal(a, b)
    assert _without_times(resumed.history) == _without_times(straight.history)
    out = tmp_path / "a"
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (out / "reward_curve.png").is_file()
    assert (out / "final" / "pytorch_lora_weights.safetensors").is_file()


def test_probe_stops_when_training_path_disagrees(pipes, tmp_path):
    trainer = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", tmp_path)))
    samples = trainer.sde_rollout(trainer.inputs(0))
    samples.advantages, _ = trainer.algorithm.advantages(samples)
    batch = samples.batch
    batch.traj.log_probs += 1e-2  # as if the rollout had used another guidance scale or dtype
    with pytest.raises(ProbeError, match="first PPO ratio is not 1"):
        trainer.update(batch)


MOCK = {"reward": {"rewards": {"mock": 1.0}}}


def test_config_validation_presets_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="group_size must be at least 2 for grpo"):
        from_dict({"sample": {"group_size": 1}, **MOCK})
    with pytest.raises(ConfigError, match=r"unknown keys in 'train': \['lr'\]"):
        from_dict({"train": {"lr": 1.0}})
    with pytest.raises(ConfigError, match="preset 'nope' is unknown"):
        from_dict({"preset": "nope"})
    with pytest.raises(ConfigError, match="sde_window"):
        from_dict({"sample": {"num_steps": 4, "sde_window": [2, 9]}, **MOCK})
    cfg = from_dict({"preset": "flow_grpo", "train": {"kl_beta": 0.01}, **MOCK})
    # Flow-GRPO's published SD3.5 defaults, with the user's override on top
    assert (cfg.sample.num_steps, cfg.sample.noise_level, cfg.sample.group_size, cfg.sample.guidance_scale) == (10, 0.7, 24, 4.5)
    assert (cfg.train.clip_range, cfg.train.timestep_fraction, cfg.train.kl_beta, cfg.model.lora_rank) == (1e-4, 0.99, 0.01, 32)
    dance = from_dict({"preset": "dance_grpo", **MOCK})
    assert (dance.sample.kernel, dance.sample.noise_level, dance.sample.group_size, dance.train.timestep_fraction) == ("dance_sde", 0.3, 12, 0.6)
    assert parse_overrides(["sample.sde_window=[0, 3]", "train.lr=1e-4"]) == {"sample": {"sde_window": [0, 3]}, "train": {"lr": 1e-4}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preset": "ddpo", "train": {"iterations": 3}, **MOCK}))
    cfg = load_config(path, ["train.iterations=5"])
    assert (cfg.train.iterations, cfg.sample.kernel, cfg.sample.num_steps) == (5, "ddim", 50)


def test_cli_train_and_config(pipes, tmp_path, capsys):
    from diffusion_rl.cli import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg(pipes["flux"], "flux", "grpo", tmp_path / "out")))
    assert main(["train", "--config", str(path), "prompts.eval=[a red square]", "train.iterations=1"]) == 0
    assert "eval/mock" in capsys.readouterr().out
    assert (tmp_path / "out" / "eval_grid_start.png").is_file()
    assert main(["config", "--preset", "pref_grpo", "reward.rewards={mock: 1}"]) == 0
    assert "ratio_norm: true" in capsys.readouterr().out
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_two_process_data_parallel_equals_one_process(pipes, tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes and the same global batch gives the same weights: GRPO, and in the
    same launch (one launcher and one torch/diffusers import per process for both) online Diffusion-DPO, whose
    processes each hold whole groups and so pair their own samples (was test_algorithm_dpo's own launch, now
    `slow` there); then the reward-hacking monitor's rollback, on which both processes must agree
    (test_hacking_guard_distributed.py's runner and checks; its own torchrun launch is `slow` there); then the FSDP2
    full fine-tune's save/resume == uninterrupted == DDP and its exported final/ (tests/_helpers/fsdp_cpu_run.py,
    test_diffusion_rl_accelerate.py's check_fsdp_run; its own torchrun launch is `slow` there)."""
    from tests._helpers.two_process import assert_trained_params_match, launch_two_processes
    from tests.diffusion_rl import test_hacking_guard_distributed as guard
    from tests.diffusion_rl.test_algorithm_dpo import check_two_process_dpo, write_two_process_dpo_config
    from tests.diffusion_rl.test_diffusion_rl_accelerate import check_fsdp_run, write_fsdp_config

    cfg = _cfg(pipes["sd3"], "sd3", "grpo", tmp_path / "dp2", iterations=1, timestep_selection="random",
               timestep_fraction=0.5)
    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["advantage"]["std_scope"] = "global"
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp_path / "dpo").mkdir()
    dpo_path, dpo = write_two_process_dpo_config(tmp_path / "dpo", tiny_pipeline_dir)
    guard_root = tmp_path / "guard"
    guard_root.mkdir()
    guard_cfg = guard.write_guard_config(guard_root, tiny_pipeline_dir("sd3"))
    fsdp_root = tmp_path / "fsdp"
    fsdp_root.mkdir()
    fsdp_path, fsdp_cfg = write_fsdp_config(pipes["sd3"], fsdp_root)
    launch_two_processes([path, dpo_path], then=[
        ("tests._helpers.hacking_guard_dist_run", str(guard_cfg), str(guard_root)),
        ("tests._helpers.fsdp_cpu_run", str(fsdp_path), str(fsdp_root / "out"))])
    guard.check_stopped_together(guard_root)
    guard.check_best_gold_weights(guard_root)
    check_fsdp_run(pipes["sd3"], fsdp_root, fsdp_cfg)
    cfg["log"]["output_dir"] = str(tmp_path / "dp1")
    one = Trainer(from_dict(cfg))
    one.fit()
    two = read_checkpoint(tmp_path / "dp2" / "checkpoints" / "iter_000001")
    # same rollouts and rewards, same gradient (its global norm is measured before the optimiser step) ...
    assert two["history"][0]["reward/mock"] == pytest.approx(one.history[0]["reward/mock"], rel=1e-6, abs=1e-6)
    assert two["history"][0]["train/grad_norm"] == pytest.approx(one.history[0]["train/grad_norm"], rel=1e-4)
    # ... and the same Adam step, to 1% of the learning rate (Adam amplifies float noise on
    # coordinates whose gradient is near its eps)
    assert_trained_params_match(one, two["params"], atol=1e-2 * cfg["train"]["learning_rate"])

    # DPO: the same rewards, pairs, gradient norm and weights as one process
    check_two_process_dpo(tmp_path / "dpo", dpo)


class _Killed(BaseException):
    """Stands for SIGKILL: not an Exception, so nothing on the way up handles it."""


def test_kill_during_checkpoint_then_resume_latest(pipes, tmp_path, monkeypatch):
    """Killed while writing checkpoint 2 (after logging iteration 2): resume_from=latest takes checkpoint 1, the
    run ends bit-identical to an uninterrupted one, and metrics.jsonl holds each iteration once."""
    import safetensors.torch

    def cfg(out, **kw):
        return from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=3, **kw) | {
            "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False, "save_every": 1}})

    straight = Trainer(cfg(tmp_path / "a"))
    straight.fit()
    real_save = safetensors.torch.save_file

    def dying_save(tensors, filename, *a, **kw):
        if "iter_000002" in str(filename) and str(filename).endswith("optimizer.safetensors"):
            Path(filename).write_bytes(b"\x00" * 7)  # a partial file, then the process dies
            raise _Killed
        return real_save(tensors, filename, *a, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", dying_save)
    with pytest.raises(_Killed):
        Trainer(cfg(tmp_path / "b")).fit()
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    ckpts = tmp_path / "b" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("iter_*")) == ["iter_000001"]  # the partial save is not a checkpoint
    logged = [json.loads(line)["iteration"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]  # iteration 2 was logged before the kill

    resumed = Trainer(cfg(tmp_path / "b", resume_from="latest"))
    assert resumed.iteration == 1
    resumed.fit()
    for a, b in zip(straight.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    assert _without_times(resumed.history) == _without_times(straight.history)
    logged = [json.loads(line)["iteration"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_000001", "iter_000002", "iter_000003"]  # temporaries gone


def _break_missing_state(ckpt: Path) -> None:
    (ckpt / "trainer_state.json").unlink()


def _break_truncated_params(ckpt: Path) -> None:
    data = (ckpt / "params.safetensors").read_bytes()
    (ckpt / "params.safetensors").write_bytes(data[: len(data) // 2])


def _break_corrupt_json(ckpt: Path) -> None:
    (ckpt / "trainer_state.json").write_text('{"format": 2, "iter')


def _break_legacy_zero_bytes(ckpt: Path) -> None:
    for f in ckpt.iterdir():
        f.unlink()
    (ckpt / "trainer_state.pt").write_bytes(b"")  # what SIGKILL during the old torch.save left behind


def _break_empty_dir(ckpt: Path) -> None:
    for f in ckpt.iterdir():
        f.unlink()


@pytest.mark.parametrize("breaker", [_break_missing_state, _break_truncated_params, _break_corrupt_json,
                                     _break_legacy_zero_bytes, _break_empty_dir])
def test_resume_latest_skips_incomplete_checkpoints(pipes, tmp_path, breaker):
    import shutil

    out = tmp_path / "run"
    trainer = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=1)))
    trainer.fit()
    good = out / "checkpoints" / "iter_000001"
    bad = out / "checkpoints" / "iter_000002"
    shutil.copytree(good, bad)
    breaker(bad)
    with pytest.warns(UserWarning, match="skipping .*iter_000002"):
        resumed = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=2, resume_from="latest")))
    assert resumed.iteration == 1
    for a, b in zip(trainer.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="iter_000002"):  # named explicitly, it is an error, not a fallback
        Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=2, resume_from=str(bad))))


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_resume_never_unpickles_code(pipes, tmp_path, monkeypatch):
    """A checkpoint holding a pickled object (old single-file format) is refused, and the code in it never runs."""
    out = tmp_path / "run"
    trainer = Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=1)))
    trainer.fit()
    ckpt = out / "checkpoints" / "iter_000001"
    assert sorted(p.suffix for p in ckpt.iterdir()) == [".json", ".safetensors", ".safetensors"]
    evil = tmp_path / "evil"
    evil.mkdir()
    state = trainer.checkpoint_state()
    state["history"] = [_Payload()]
    torch.save(state, evil / "trainer_state.pt")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="trainer_state.pt cannot be read"):
        Trainer(from_dict(_cfg(pipes["sd3"], "sd3", "grpo", out, iterations=2, resume_from=str(evil))))
    assert not (tmp_path / "PWNED").exists()


def test_config_types_are_checked_when_built_in_code():
    with pytest.raises(ConfigError, match="train.iterations .*whole number"):
        TrainConfig(iterations=2.5)
    with pytest.raises(ConfigError, match="train.learning_rate must be a finite number"):
        TrainConfig(learning_rate=float("nan"))
    cfg = from_dict({"train": {"learning_rate": "1e-4", "iterations": "7"}, **MOCK})  # YAML 1.1 leaves 1e-4 a string
    assert (cfg.train.learning_rate, cfg.train.iterations) == (1e-4, 7)
    assert isinstance(cfg.train.learning_rate, float) and isinstance(cfg.train.iterations, int)
    assert load_config(None, ["log.output_dir='1e5'", "reward.rewards={mock: 1}"]).log.output_dir == "1e5"  # quoted: stays a string


def _cli_cases(pipe: str, tmp: Path) -> dict[str, tuple[list[str], str]]:
    base = tmp / "run.yaml"
    base.write_text(yaml.safe_dump(_cfg(pipe, "sd3", "grpo", tmp / "out")))
    (tmp / "invalid.yaml").write_text("model: [unclosed\n")
    (tmp / "empty.yaml").write_text("# nothing\n")
    (tmp / "list.yaml").write_text("- model\n")
    train = ["train", "--config", str(base)]
    return {
        "empty pretrained": (train + ["model.pretrained=''"], "model.pretrained is empty"),
        "null pretrained": (train + ["model.pretrained="], "model.pretrained must be a string"),
        "missing pretrained": (train + [f"model.pretrained={tmp / 'nope'}"], "model.pretrained: .* does not exist"),
        "not a pipeline": (train + [f"model.pretrained={tmp}"], "model.pretrained: .* no model_index.json"),
        "unknown reward": (train + ["reward.rewards={nope: 1.0}"], "nope"),
        "bad reward option": (train + ["reward.options={mock: {bogus: 1}}"], "reward.options.mock"),
        "missing eval prompts": (train + [f"prompts.eval={tmp / 'eval.txt'}"], "prompts.eval"),
        "missing train prompts": (train + [f"prompts.train={tmp / 'train.txt'}"], "prompts.train"),
        "resume missing": (train + [f"train.resume_from={tmp / 'ckpt'}"], "train.resume_from"),
        "resume latest none": (train + ["train.resume_from=latest"], "no complete checkpoint"),
        "invalid yaml": (["train", "--config", str(tmp / "invalid.yaml")], "not valid YAML"),
        "empty yaml": (["train", "--config", str(tmp / "empty.yaml")], "is empty"),
        "list yaml": (["train", "--config", str(tmp / "list.yaml")], "top level must be a mapping"),
        "bad override yaml": (train + ["train.iterations=[1"], "not valid YAML"),
        "non-numeric": (train + ["train.learning_rate=abc"], "train.learning_rate must be a number"),
        "list for number": (train + ["train.iterations=[1, 2]"], "train.iterations must be a whole number"),
        "bool for number": (train + ["train.learning_rate=true"], "train.learning_rate must be a number"),
        "number for bool": (train + ["model.lora=1"], "model.lora must be true or false"),
        "nan": (train + ["train.learning_rate=nan"], "finite"),
        "yaml nan": (train + ["train.clip_range=.nan"], "finite"),
        "inf": (train + ["train.max_grad_norm=inf"], "finite"),
        "nan reward weight": (train + ["reward.rewards={mock: .nan}"], "reward.rewards.mock must be a finite"),
        "fractional count": (train + ["sample.group_size=8.5"], "sample.group_size .*whole number"),
        "float count 1e9": (train + ["train.iterations=1e9"], "train.iterations .*whole number"),
        "negative beta": (train + ["train.adam_beta1=-0.1"], "train.adam_beta1"),
        "list for string": (train + ["log.output_dir=[a]"], "log.output_dir must be a string"),
        "bad enum": (train + ["sample.kernel=euler"], "sample.kernel must be one of"),
        "moved key": (train + ["train.nft_beta=2.0"], r"train.nft_beta moved to nft.beta"),
        "unread method key": (train + ["nft.beta=2.0"], "nft.beta is read by nft, not by train.algorithm grpo"),
        "config nan": (["config", "train.learning_rate=nan"], "finite"),
        "config no reward": (["config", "--preset", "flow_grpo"], "reward.rewards is not set"),
        "config invalid yaml": (["config", "--config", str(tmp / "invalid.yaml")], "not valid YAML"),
        "config bad preset type": (["config", "preset=[1]"], "preset must be a string"),
        "reno missing pipeline": (["reno", "--pipeline", str(tmp / "nope"), "--prompt", "a", "--reward", "mock=1"],
                                  "--pipeline: .* does not exist"),
        "reno nan lr": (["reno", "--pipeline", pipe, "--prompt", "a", "--reward", "mock=1", "--lr", "nan"],
                        "--lr must be a finite"),
        "reno nan weight": (["reno", "--pipeline", pipe, "--prompt", "a", "--reward", "mock=nan"], "finite"),
        "best-of-n zero n": (["best-of-n", "--pipeline", pipe, "--prompt", "a", "--reward", "mock=1", "--n", "0"],
                             "--n must be >= 1"),
        "best-of-n unknown reward": (["best-of-n", "--pipeline", pipe, "--prompt", "a", "--reward", "nope=1"], "nope"),
    }


CLI_CASES = [
    "empty pretrained", "null pretrained", "missing pretrained", "not a pipeline", "unknown reward", "bad reward option",
    "missing eval prompts", "missing train prompts", "resume missing", "resume latest none", "invalid yaml",
    "empty yaml", "list yaml", "bad override yaml", "non-numeric", "list for number", "bool for number",
    "number for bool", "nan", "yaml nan", "inf", "nan reward weight", "fractional count", "float count 1e9",
    "negative beta", "list for string", "bad enum", "moved key", "unread method key", "config nan", "config no reward", "config invalid yaml", "config bad preset type",
    "reno missing pipeline", "reno nan lr", "reno nan weight", "best-of-n zero n", "best-of-n unknown reward",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_usage_errors_are_one_line_exit_2(pipes, tmp_path, capsys, case):
    from diffusion_rl.cli import main

    cases = _cli_cases(pipes["sd3"], tmp_path)
    assert set(cases) == set(CLI_CASES)
    argv, match = cases[case]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert re.search(match, lines[0]), lines[0]
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
