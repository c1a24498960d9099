"""Diffusion-DPO, online and offline: the loss equals the paper's formula computed independently (transcribed
from SalesforceAIResearch/DiffusionDPO@5233e75 train.py lines 1122-1145), best/worst pairs on a hand-built reward
table, one iteration on tiny SD3 and FLUX pipelines changes the LoRA, and a resumed run equals a straight one.
Offline: every `mmreward train-pref` pair layout (JSONL, parquet) is read with ties dropped and typed errors for
bad sources, each pair is visited once per epoch, and the image encoder is the exact inverse of the adapter's
decode."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from diffusion_rl.algorithms.dpo import best_worst_pairs, dpo_loss, flow_matching_error
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import (
    FOUR_PROMPTS,
    assert_trained_params_match,
    assert_two_processes_match_one,
    launch_two_processes,
)


def _reference_dpo_loss(model_pred, ref_pred, target, beta_dpo):
    """DiffusionDPO train.py's loss, transcribed: the batch is [winners; losers] along dim 0."""
    model_losses = (model_pred - target).pow(2).mean(dim=[1, 2, 3])
    model_losses_w, model_losses_l = model_losses.chunk(2)
    model_diff = model_losses_w - model_losses_l
    ref_losses = (ref_pred - target).pow(2).mean(dim=[1, 2, 3])
    ref_losses_w, ref_losses_l = ref_losses.chunk(2)
    ref_diff = ref_losses_w - ref_losses_l
    scale_term = -0.5 * beta_dpo
    inside_term = scale_term * (model_diff - ref_diff)
    implicit_acc = (inside_term > 0).sum().float() / inside_term.size(0)
    return -1 * torch.nn.functional.logsigmoid(inside_term).mean(), implicit_acc


@pytest.mark.parametrize("beta", [5000.0, 2.0])
def test_dpo_loss_equals_the_reference_train_py(beta):
    g = torch.Generator().manual_seed(0)
    shape = (6, 4, 3, 3)  # 3 pairs: rows 0-2 winners, 3-5 losers
    x0 = torch.randn(shape, generator=g)
    eps = torch.randn(shape, generator=g)[:3].repeat(2, 1, 1, 1)  # noise shared within a pair
    target = eps - x0
    model_pred = target + 0.05 * torch.randn(shape, generator=g)
    ref_pred = target + 0.05 * torch.randn(shape, generator=g)
    expected, expected_acc = _reference_dpo_loss(model_pred, ref_pred, target, beta)
    err, ref_err = flow_matching_error(model_pred, x0, eps), flow_matching_error(ref_pred, x0, eps)
    loss, acc = dpo_loss(err[:3], err[3:], ref_err[:3], ref_err[3:], beta)
    assert_close_scaled(loss.mean(), expected, rel=1e-6)
    assert float(acc.mean()) == pytest.approx(float(expected_acc))


def test_dpo_loss_closed_form_and_gradient_direction():
    """-log sigmoid(z) at hand-picked errors, and the gradient lowers the winner's error, raises the loser's."""
    err_w = torch.tensor([0.30, 0.10], requires_grad=True)
    err_l = torch.tensor([0.20, 0.40], requires_grad=True)
    ref_w, ref_l = torch.tensor([0.25, 0.25]), torch.tensor([0.25, 0.25])
    loss, acc = dpo_loss(err_w, err_l, ref_w, ref_l, beta=10.0)
    z = [-5.0 * ((0.30 - 0.20) - 0.0), -5.0 * ((0.10 - 0.40) - 0.0)]  # -beta/2 (model diff - ref diff)
    expected = torch.tensor([math.log1p(math.exp(-v)) for v in z])
    assert_close_scaled(loss.detach(), expected, rel=1e-6)
    assert acc.tolist() == [0.0, 1.0]
    loss.sum().backward()
    assert (err_w.grad > 0).all() and (err_l.grad < 0).all()


def test_equal_policy_and_reference_give_log_2():
    e = torch.tensor([0.3, 0.7])
    loss, _ = dpo_loss(e, e.flip(0), e, e.flip(0), beta=5000.0)
    assert_close_scaled(loss, torch.full((2,), math.log(2.0)), rel=1e-7)


def test_best_worst_pairs_on_a_hand_built_reward_table():
    # groups (slots) 3, 3, 3, 5, 5, 5, 7, 7, 7: best/worst rows (1, 2), (3, 5) and a tied group 7
    scores = torch.tensor([0.5, 0.9, 0.1, 2.0, 1.0, -1.0, 0.4, 0.4, 0.4])
    groups = torch.tensor([3, 3, 3, 5, 5, 5, 7, 7, 7])
    win, lose, valid = best_worst_pairs(scores, groups)
    assert win.tolist() == [1, 3, 6] and lose.tolist()[:2] == [2, 5]
    assert valid.tolist() == [1.0, 1.0, 0.0]
    # ties inside a group pick the first row
    win, lose, valid = best_worst_pairs(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    assert (win.tolist(), lose.tolist(), valid.tolist()) == ([0], [2], [1.0])


def _dpo_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "diffusion_dpo",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, **train},
        "dpo": {"beta": 50.0},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


def _dpo_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict(_dpo_dict(kind, tmp_path, tiny_pipeline_dir, **train))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_dpo_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_dpo_config(kind, tmp_path, tiny_pipeline_dir))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    # the LoRA starts at zero (B = 0), so the policy equals the reference: every pair's loss is log 2
    assert metrics["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5)
    assert metrics["dpo/pairs"] == 2.0 and math.isfinite(metrics["train/grad_norm"]) and metrics["train/grad_norm"] > 0
    after = [p.detach().clone() for p in trainer.trainable]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert trainer.last_images.shape == (6, 3, 16, 16)
    assert metrics["train/implicit_acc"] == 0.0  # z = 0 exactly before the step


def test_dpo_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "diffusion_dpo", "reward": rw})
    assert cfg.train.algorithm == "dpo" and cfg.dpo.beta == 5000.0 and cfg.sample.kernel == "ode"
    with pytest.raises(ConfigError, match="dpo.beta"):
        from_dict({"preset": "diffusion_dpo", "dpo": {"beta": 0.0}, "reward": rw})
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "diffusion_dpo", "sample": {"group_size": 1}, "reward": rw})


def test_dpo_refuses_a_non_flow_model(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = _dpo_config("sd", tmp_path, tiny_pipeline_dir)
    trainer = Trainer(cfg)
    with pytest.raises(ConfigError, match="flow"):
        trainer.train_iteration(0)


def test_interrupted_and_resumed_dpo_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters and every metric, bit for bit."""
    from diffusion_rl.trainer import Trainer

    straight = Trainer(_dpo_config("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=2))
    straight.fit()
    first = Trainer(_dpo_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=1))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"
    resumed = Trainer(_dpo_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2, resume_from=str(ckpt)))
    assert resumed.iteration == 1
    resumed.fit()
    assert_resumed_equals_straight(straight, resumed)
    assert straight.history[-1]["train/loss"] != pytest.approx(math.log(2.0))  # the second iteration trained a moved LoRA


def test_one_dpo_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir):
    """Wan (text-to-video): pairs of clips, one shared (t, eps) per pair; policy == reference at the start."""
    from diffusion_rl.trainer import Trainer

    cfg = tiny_video(_dpo_config("wan", tmp_path, tiny_pipeline_dir))
    cfg.sample.group_size, cfg.sample.batch_size = 2, 4
    trainer = Trainer(cfg)
    metrics = train_one_iteration(trainer)
    assert metrics["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5) and metrics["train/grad_norm"] > 0
    assert trainer.last_images.shape == (4, 9, 3, 32, 32)


def write_two_process_dpo_config(out: Path, tiny_pipeline_dir) -> tuple[Path, dict]:
    """The online DPO run both 2-process checks launch: 4 prompts, so each process holds whole groups and pairs
    its own samples; returns the YAML path (the run writes to `out`/dp2) and its config."""
    cfg = _dpo_dict("sd3", out / "dp2", tiny_pipeline_dir)
    cfg["sample"]["prompts_per_iteration"] = 4
    cfg["prompts"]["train"] = list(FOUR_PROMPTS)
    path = out / "dpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def check_two_process_dpo(out: Path, cfg: dict) -> None:
    """The 2-process run in `out`/dp2 has the same rewards, pairs, gradient norm and weights as one process."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    one = Trainer(from_dict({**cfg, "log": {**cfg["log"], "output_dir": str(out / "dp1")}}))
    one.fit()
    two = read_checkpoint(out / "dp2" / "sd3" / "checkpoints" / "iter_000001")
    assert two["history"][0]["dpo/pairs"] == one.history[0]["dpo/pairs"] == 4.0
    assert_two_processes_match_one(one, two, cfg["train"]["learning_rate"])


@pytest.mark.slow
def test_two_process_dpo_equals_one_process(tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes (each holding whole groups, so its own pairs) and the same global
    batch: the same rewards, gradient norm and weights as one process.

    Slow: the default suite runs this same check (this config, these assertions) in the launch it shares with the
    generic GRPO check, test_diffusion_rl_train.py::test_two_process_data_parallel_equals_one_process."""
    path, cfg = write_two_process_dpo_config(tmp_path, tiny_pipeline_dir)
    launch_two_processes(path)
    check_two_process_dpo(tmp_path, cfg)


# ----------------------------------------------------------------------------------------------
# offline Diffusion-DPO: preference pairs from a dataset (dpo.pairs)
# ----------------------------------------------------------------------------------------------
def _write_pairs(folder: Path, rows: int = 4) -> Path:
    """A JSONL of {prompt, chosen, rejected} rows over small distinct PNGs (relative paths), in the layout
    `mmreward train-pref` reads."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    lines = []
    for i in range(rows):
        for kind in ("w", "l"):
            pixels = (torch.rand(20, 24, 3, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels).save(folder / f"{kind}{i}.png")
        lines.append({"prompt": f"shape {i}", "chosen": f"w{i}.png", "rejected": f"l{i}.png"})
    path = folder / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    return path


def test_offline_pairs_read_every_train_pref_layout_and_refuse_bad_sources(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from diffusion_rl.algorithms.dpo import load_preference_pairs
    from mmreward.errors import RewardInputError

    src = _write_pairs(tmp_path / "d", rows=2)
    prompts, chosen, rejected, ties = load_preference_pairs(str(src))
    assert prompts == ["shape 0", "shape 1"] and ties == 0
    assert [Path(c).name for c in chosen] == ["w0.png", "w1.png"] and [Path(r).name for r in rejected] == ["l0.png", "l1.png"]
    # train-pref's {image_a, image_b, label}: label 0 prefers b (swapped), 0.5 is a tie (dropped), in a parquet file
    d = tmp_path / "d"
    table = pa.table({"prompt": ["a", "b", "c"], "image_a": ["w0.png", "w1.png", "w0.png"],
                      "image_b": ["l0.png", "l1.png", "l1.png"], "label": [1.0, 0.0, 0.5]})
    pq.write_table(table, d / "pairs.parquet")
    prompts, chosen, rejected, ties = load_preference_pairs(str(d / "pairs.parquet"))
    assert prompts == ["a", "b"] and ties == 1
    assert [Path(c).name for c in chosen] == ["w0.png", "l1.png"] and [Path(r).name for r in rejected] == ["l0.png", "w1.png"]
    with pytest.raises(ConfigError, match="does not exist"):
        load_preference_pairs(str(tmp_path / "missing.jsonl"))
    (d / "ties.jsonl").write_text('{"prompt": "a", "image_a": "w0.png", "image_b": "l0.png", "label": 0.5}\n' * 2)
    with pytest.raises(RewardInputError, match="ties"):
        load_preference_pairs(str(d / "ties.jsonl"))
    (d / "bad.jsonl").write_text('{"prompt": "a", "winner": "w0.png"}\n{"prompt": "b", "winner": "w1.png"}\n')
    with pytest.raises(RewardInputError, match="chosen"):
        load_preference_pairs(str(d / "bad.jsonl"))


def test_offline_pair_order_visits_every_pair_once_per_epoch():
    from diffusion_rl.algorithms.dpo import pair_indices

    stream = torch.cat([pair_indices(5, 3, seed=7, it=it) for it in range(5)])  # 15 positions = 3 epochs of 5
    for epoch in stream.split(5):
        assert sorted(epoch.tolist()) == [0, 1, 2, 3, 4]
    assert not torch.equal(stream[:5], stream[5:10])  # each epoch has its own shuffle
    assert torch.equal(pair_indices(5, 3, seed=7, it=3), stream[9:12])  # a resumed run reads the same rows


def test_fit_image_covers_then_center_crops():
    from diffusion_rl.algorithms.dpo import fit_image

    img = torch.rand(3, 4, 8)
    assert torch.equal(fit_image(img, 4, 4), img[:, :, 2:6])  # same height: only the crop, the middle columns
    up = fit_image(torch.full((3, 2, 2), 0.25), 4, 6)  # a constant image stays constant at any size
    assert up.shape == (3, 4, 6) and torch.allclose(up, torch.full_like(up, 0.25))


@pytest.mark.parametrize("kind", ["flux"])  # FLUX: the shift and scale SD3 shares, and the 2x2 packing
def test_encode_images_inverts_the_adapter_decode(kind, tiny_pipeline_dir):
    """decode(encode(x)) through the adapter equals the VAE's own decode of its posterior mode: the shift, scale
    and FLUX's 2x2 packing of `encode_images` are the exact inverse of the adapter's `_decode_latents`."""
    from diffusion_rl.algorithms.dpo import encode_images
    from diffusion_rl.pipelines import load_pipeline, make_adapter

    pipe = load_pipeline(str(tiny_pipeline_dir(kind)))
    adapter = make_adapter(pipe, 16, 16)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    z = encode_images(adapter, x)
    assert z.shape == (2, *adapter.latent_shape())
    with torch.no_grad():
        ours = adapter._decode_latents(z)
        direct = pipe.vae.decode(pipe.vae.encode(x * 2 - 1).latent_dist.mode(), return_dict=False)[0]
    assert_close_scaled(ours, direct, rel=1e-5)


def _offline_dict(kind, tmp_path, tiny_pipeline_dir, pairs, **train):
    return {
        "preset": "diffusion_dpo_offline",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "prompts_per_iteration": 2},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, **train},
        "dpo": {"beta": 50.0, "pairs": str(pairs)},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


def test_diffusion_rl_train_runs_the_offline_dpo_preset_on_tiny_sd3(tmp_path, tiny_pipeline_dir):
    """`diffusion-rl train` with `preset: diffusion_dpo_offline` and a pair file named relative to the YAML."""
    from diffusion_rl.cli import main

    pairs = _write_pairs(tmp_path / "data")
    cfg = _offline_dict("sd3", tmp_path, tiny_pipeline_dir, "data/pairs.jsonl")
    path = tmp_path / "offline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert pairs.is_file() and main(["train", "--config", str(path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "sd3" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    # policy == reference at the start (LoRA B = 0): every pair's loss is log 2
    assert len(trained) == 1 and trained[0]["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5)
    assert trained[0]["dpo/pairs"] == 2.0 and trained[0]["dpo/dataset_pairs"] == 4.0 and trained[0]["train/grad_norm"] > 0


@pytest.mark.slow  # the default suite runs offline DPO on tiny SD3 through the CLI
def test_one_offline_dpo_iteration_trains_tiny_flux_and_refuses_a_video_pipeline(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    pairs = _write_pairs(tmp_path / "data")
    trainer = Trainer(from_dict(_offline_dict("flux", tmp_path, tiny_pipeline_dir, pairs)))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert metrics["train/loss"] == pytest.approx(math.log(2.0), rel=1e-5) and metrics["train/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable))
    assert trainer.last_images.shape == (2, 3, 16, 16)  # the chosen images of the iteration's first micro-batch
    cfg = tiny_video(from_dict(_offline_dict("wan", tmp_path, tiny_pipeline_dir, pairs)))
    with pytest.raises(ConfigError, match="SD3 or FLUX"):
        Trainer(cfg).train_iteration(0)


def test_offline_dpo_config_checks(tmp_path):
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "diffusion_dpo_offline", "dpo": {"pairs": "p.jsonl"}, "sample": {"group_size": 1},
                     "reward": rw})  # no groups offline: group_size does not matter
    assert (cfg.dpo.beta, cfg.train.learning_rate, cfg.sample.prompts_per_iteration) == (5000.0, 2.048e-5, 2048)
    with pytest.raises(ConfigError, match="dpo.pairs is read by dpo, not by train.algorithm raft"):
        from_dict({"preset": "raft", "dpo": {"pairs": "p.jsonl"}, "reward": rw})


@pytest.mark.slow
def test_offline_dpo_resumes_bit_exact_and_two_processes_equal_one(tmp_path, tiny_pipeline_dir):
    """1 iteration + resume == 2 straight (weights and metrics, bit for bit); 2 gloo processes, each encoding and
    training its own pairs, give the same gradient norm and weights as 1 process."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    pairs = _write_pairs(tmp_path / "data", rows=6)

    def run(sub, **train):
        t = Trainer(from_dict(_offline_dict("sd3", tmp_path / sub, tiny_pipeline_dir, pairs, **train)))
        t.fit()
        return t

    straight = run("a", iterations=2)
    run("b", iterations=1)
    resumed = run("b", iterations=2, resume_from=str(tmp_path / "b" / "sd3" / "checkpoints" / "iter_000001"))
    assert_resumed_equals_straight(straight, resumed)

    cfg = _offline_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir, pairs)
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    launch_two_processes(path)
    one = run("dp1")
    two = read_checkpoint(tmp_path / "dp2" / "sd3" / "checkpoints" / "iter_000001")
    assert two["history"][0]["train/grad_norm"] == pytest.approx(one.history[0]["train/grad_norm"], rel=1e-4)
    assert_trained_params_match(one, two["params"], atol=1e-4)
