"""Resume never trusts a checkpoint (issue 28 item 19): every field of trainer_state.json and every tensor is
checked before training, a bad one is a CheckpointError naming the field, and resume_from=latest skips it with a
warning and falls back to the checkpoint before. Reward weights of an integer dtype where the model has
floating-point parameters are refused in every family, naming the key."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffusion_rl.checkpointing import find_resume, read_checkpoint
from diffusion_rl.config import from_dict
from diffusion_rl.trainer import Trainer
from mmreward.errors import CheckpointError
from tests.mmreward.test_hardening_loading import FAMILIES, _load, _read, _save_sd, family_dirs  # noqa: F401 - fixture


def _cfg(pipe: str, out: Path, **train) -> dict:
    return {
        "model": {"pretrained": pipe, "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4,
                  "max_sequence_length": 8},
        "sample": {"num_steps": 2, "guidance_scale": 2.0, "kernel": "flow_sde", "noise_level": 0.7,
                   "prompts_per_iteration": 2, "group_size": 2, "batch_size": 4},
        "train": {"algorithm": "grpo", "iterations": 1, "learning_rate": 1e-2, "timestep_fraction": 0.5, "ema": True,
                  **train},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_pipeline_dir):
    """One trained iteration (so the optimizer has moments) and its checkpoint; the session's tiny SD3 pipeline
    (conftest.tiny_pipeline_dir: built once per worker, used read-only)."""
    root = tmp_path_factory.mktemp("resume_validation")
    pipe = str(tiny_pipeline_dir("sd3"))
    Trainer(from_dict(_cfg(pipe, root / "run"))).fit()
    return pipe, root / "run" / "checkpoints" / "iter_000001"


def _edit_meta(ckpt: Path, edit) -> None:
    meta = json.loads((ckpt / "trainer_state.json").read_text())
    edit(meta)
    (ckpt / "trainer_state.json").write_text(json.dumps(meta))  # NaN written as JSON's NaN, as json.dumps does


def _edit_tensors(ckpt: Path, file: str, edit) -> None:
    tensors = dict(load_file(str(ckpt / file)))
    edit(tensors)
    save_file(tensors, str(ckpt / file))
    _edit_meta(ckpt, lambda m: m["files"].__setitem__(file, (ckpt / file).stat().st_size))


def _group(m: dict) -> dict:
    return m["optimizer"]["param_groups"][0]


def _moment(t: dict) -> str:
    return next(k for k in sorted(t) if k.endswith(".exp_avg"))


CASES = {
    "negative iteration": (lambda c: _edit_meta(c, lambda m: m.__setitem__("iteration", -3)), "'iteration'"),
    "bool iteration": (lambda c: _edit_meta(c, lambda m: m.__setitem__("iteration", True)), "'iteration'"),
    "bool optimizer_steps": (lambda c: _edit_meta(c, lambda m: m.__setitem__("optimizer_steps", False)),
                             "'optimizer_steps'"),
    "nan lr": (lambda c: _edit_meta(c, lambda m: _group(m).__setitem__("lr", math.nan)), r"param_groups\[0\]\.lr"),
    "negative lr": (lambda c: _edit_meta(c, lambda m: _group(m).__setitem__("lr", -1e-3)), r"param_groups\[0\]\.lr"),
    "string betas": (lambda c: _edit_meta(c, lambda m: _group(m).__setitem__("betas", "xy")), r"\.betas'"),
    "beta of 1": (lambda c: _edit_meta(c, lambda m: _group(m).__setitem__("betas", [0.9, 1.0])), r"betas\[1\]"),
    "infinite eps": (lambda c: _edit_meta(c, lambda m: _group(m).__setitem__("eps", math.inf)), r"\.eps'"),
    "unknown group param": (lambda c: _edit_meta(c, lambda m: _group(m)["params"].append("nope.weight")),
                            "param_groups"),
    "history iteration string": (lambda c: _edit_meta(c, lambda m: m["history"][0].__setitem__("iteration", "1")),
                                 r"history\[0\]\.iteration"),
    "history not a list": (lambda c: _edit_meta(c, lambda m: m.__setitem__("history", {"a": 1})), "'history'"),
    "run_id number": (lambda c: _edit_meta(c, lambda m: m.__setitem__("run_id", 7)), "'run_id'"),
    "file outside": (lambda c: _edit_meta(c, lambda m: m["files"].__setitem__("../params.safetensors", 1)),
                     r"files\.\.\./params"),
    "ema size bool": (lambda c: _edit_meta(c, lambda m: m["ema"].__setitem__("size", True)), "'ema.size'"),
    "duplicate json key": (lambda c: (c / "trainer_state.json").write_text(
        (c / "trainer_state.json").read_text().replace('{"format": 3,', '{"format": 3, "iteration": 0,', 1)),
        "duplicate key 'iteration'"),
    "moment wrong shape": (lambda c: _edit_tensors(c, "optimizer.safetensors", lambda t: t.__setitem__(
        _moment(t), torch.zeros(3))), r"exp_avg' has shape \(3,\)"),
    "moment unknown parameter": (lambda c: _edit_tensors(c, "optimizer.safetensors", lambda t: t.__setitem__(
        "not.a.param.exp_avg", torch.zeros(2))), "optimizer.state.not.a.param"),
    "nan moment": (lambda c: _edit_tensors(c, "optimizer.safetensors", lambda t: t[_moment(t)].fill_(math.nan)),
                   r"exp_avg' must be finite"),
    "negative second moment": (lambda c: _edit_tensors(c, "optimizer.safetensors", lambda t: t[
        _moment(t) + "_sq"].fill_(-1.0)), "negative second moments"),
    "ema shadow wrong shape": (lambda c: _edit_tensors(c, "ema.safetensors", lambda t: t.__setitem__(
        "shadow.0", torch.zeros(5))), r"ema.shadow.0' has shape"),
    "int32 params": (lambda c: _edit_tensors(c, "params.safetensors", lambda t: t.update(
        {k: v.to(torch.int32) for k, v in t.items()})), "'params."),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_checkpoint_is_refused_naming_the_field_and_latest_falls_back(run, tmp_path, case):
    _, good = run
    out = tmp_path / "run"
    shutil.copytree(good, out / "checkpoints" / "iter_000001")
    bad = out / "checkpoints" / "iter_000002"
    shutil.copytree(good, bad)
    _edit_meta(bad, lambda m: m.__setitem__("iteration", 2))  # a later, otherwise valid checkpoint
    read_checkpoint(bad)
    breaker, field = CASES[case]
    breaker(bad)
    with pytest.raises(CheckpointError, match=field):
        read_checkpoint(bad)
    with pytest.warns(UserWarning, match=f"skipping {bad}"):
        path, state = find_resume("latest", out)
    assert path == out / "checkpoints" / "iter_000001" and state["iteration"] == 1


def test_checkpoint_beyond_train_iterations_is_refused(run, tmp_path):
    _, good = run
    with pytest.raises(CheckpointError, match=r"'iteration' is 1, beyond this run's train.iterations=0"):
        find_resume(str(good), tmp_path, iterations=0)
    assert find_resume(str(good), tmp_path, iterations=1)[1]["iteration"] == 1


def test_resume_from_iteration_minus_3_fails_before_training(run, tmp_path):
    """End to end: today this trained from iteration -3 and exited 0."""
    pipe, good = run
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    _edit_meta(bad, lambda m: m.__setitem__("iteration", -3))
    with pytest.raises(CheckpointError, match="'iteration' must be in"):
        Trainer(from_dict(_cfg(pipe, tmp_path / "out", iterations=2, resume_from=str(bad))))


def test_optimizer_settings_are_checked_against_the_run(run, tmp_path):
    """A group setting this run's AdamW does not have, or one of the wrong kind, is refused before restoring."""
    pipe, good = run
    for name, edit, match in [
        ("unknown", lambda g: g.__setitem__("warp_factor", 9), "warp_factor"),
        ("kind", lambda g: g.__setitem__("amsgrad", "yes"), r"param_groups\[0\]\.amsgrad"),
    ]:
        bad = tmp_path / name
        shutil.copytree(good, bad)
        _edit_meta(bad, lambda m, edit=edit: edit(_group(m)))
        with pytest.raises(CheckpointError, match=match):
            Trainer(from_dict(_cfg(pipe, tmp_path / f"out_{name}", iterations=2, resume_from=str(bad))))
    assert Trainer(from_dict(_cfg(pipe, tmp_path / "out_good", iterations=2, resume_from=str(good)))).iteration == 1


@pytest.mark.parametrize("key", sorted(FAMILIES))
def test_integer_weights_for_float_parameters_are_refused_in_every_family(family_dirs, tmp_path, key):  # noqa: F811
    """Today int32 weights load silently (truncated values change the scores); now the key is named."""
    folder, fam = family_dirs(key)
    work = tmp_path / "ckpt"
    shutil.copytree(folder, work)
    sd, container = _read(work / fam.weights)
    target = next(k for k in sorted(sd) if k.startswith(fam.submodule) and sd[k].is_floating_point())
    sd[target] = (sd[target] * 100).to(torch.int32)
    _save_sd(sd, work / fam.weights, container)
    with pytest.raises(CheckpointError, match="integer or bool tensors") as err:
        _load(work, fam)
    assert target in str(err.value) or target.removeprefix(fam.submodule) in str(err.value)
