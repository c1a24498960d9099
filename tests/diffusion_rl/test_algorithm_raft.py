"""RAFT: the supervised loss equals the flow-matching loss of the LMFlow RAFT-diffusion fine-tuning script
(OptimalScale/LMFlow@613bba0 experimental/RAFT-diffusion/train_text_to_image_lora.py: F.mse_loss(model_pred,
target, reduction="mean"), here with the flow target noise - x_0), top-k selection on a hand-built reward
table, one iteration on tiny SD3, FLUX and Wan pipelines trains the LoRA on the winners only, a resumed run equals
an uninterrupted one bit for bit, and 2 processes equal 1."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from diffusion_rl.algorithms.raft import raft_loss, top_k_per_group
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import assert_two_processes_match_one, one_and_two_process_runs


def test_raft_loss_is_the_reference_mse_on_the_flow_target():
    g = torch.Generator().manual_seed(1)
    x0, eps, v = (torch.randn(5, 4, 3, 3, generator=g) for _ in range(3))
    expected = F.mse_loss(v.float(), (eps - x0).float(), reduction="mean")
    assert_close_scaled(raft_loss(v, x0, eps), expected, rel=1e-6)
    # closed form: v = target + c everywhere gives c^2
    assert_close_scaled(raft_loss(eps - x0 + 0.3, x0, eps), torch.tensor(0.09), rel=1e-6)


def test_top_k_per_group_on_a_hand_built_reward_table():
    scores = torch.tensor([0.5, 0.9, 0.1, 0.7, 2.0, 1.0, -1.0, 3.0, 0.4, 0.4, 0.4, 0.4])
    groups = torch.tensor([0, 0, 0, 0, 4, 4, 4, 4, 9, 9, 9, 9])
    assert top_k_per_group(scores, groups, 1).tolist() == [1, 7, 8]
    assert top_k_per_group(scores, groups, 2).tolist() == [1, 3, 7, 4, 8, 9]  # best first; ties: earlier row
    assert top_k_per_group(scores, groups, 3).tolist() == [1, 3, 0, 7, 4, 5, 8, 9, 10]


def _raft_dict(kind, tmp_path, tiny_pipeline_dir, **train):
    return {
        "preset": "raft",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 3, "prompts_per_iteration": 2, "batch_size": 6},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, "num_inner_epochs": 2, **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    }


def _raft_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict(_raft_dict(kind, tmp_path, tiny_pipeline_dir, **train))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_raft_iteration_trains_tiny_pipelines_on_the_winners(kind, tmp_path, tiny_pipeline_dir, monkeypatch):
    from diffusion_rl.algorithms import raft as raft_mod
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_raft_config(kind, tmp_path, tiny_pipeline_dir))
    seen = {}
    real_train = raft_mod.RAFT._train

    def spy(self, it, policy, adapter, embeds, slots, sample_ids, x0_all, winners):
        seen["winners"], seen["n"] = winners.clone(), len(x0_all)
        return real_train(self, it, policy, adapter, embeds, slots, sample_ids, x0_all, winners)

    monkeypatch.setattr(raft_mod.RAFT, "_train", spy)
    scores = []
    from diffusion_rl.algorithms import dpo as ranked  # RAFT's advantage stage is dpo.rank

    real_rank = ranked.rank

    def rank_spy(*args, **kwargs):
        out = real_rank(*args, **kwargs)
        scores.append(out[0].clone())
        return out

    monkeypatch.setattr(ranked, "rank", rank_spy)
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/loss"] > 0 and metrics["train/grad_norm"] > 0
    assert metrics["raft/winners"] == 2.0 and trainer.policy.steps == 2  # 2 inner epochs x 1 minibatch
    # the winners are the best of each group of 3 (rows 0-2: slot 0, rows 3-5: slot 1)
    adv = scores[0]
    assert seen["n"] == 6
    assert seen["winners"].tolist() == [int(torch.argmax(adv[:3])), 3 + int(torch.argmax(adv[3:]))]
    after = [p.detach().clone() for p in trainer.trainable]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_raft_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "raft", "reward": rw})
    assert cfg.train.algorithm == "raft" and cfg.raft.top_k == 1 and cfg.sample.group_size == 10
    assert cfg.train.learning_rate == 9e-6 and cfg.train.num_inner_epochs == 10
    with pytest.raises(ConfigError, match="raft.top_k"):
        from_dict({"preset": "raft", "raft": {"top_k": 10}, "reward": rw})
    with pytest.raises(ConfigError, match="raft.top_k"):
        from_dict({"preset": "raft", "raft": {"top_k": 0}, "reward": rw})


def test_interrupted_and_resumed_raft_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """1 iteration, checkpoint, resume for 1 more == 2 straight: parameters and every metric, bit for bit."""
    from diffusion_rl.trainer import Trainer

    straight = Trainer(_raft_config("flux", tmp_path / "a", tiny_pipeline_dir, iterations=2, num_inner_epochs=1))
    straight.fit()
    first = Trainer(_raft_config("flux", tmp_path / "b", tiny_pipeline_dir, iterations=1, num_inner_epochs=1))
    first.fit()
    ckpt = tmp_path / "b" / "flux" / "checkpoints" / "iter_000001"
    resumed = Trainer(_raft_config("flux", tmp_path / "b", tiny_pipeline_dir, iterations=2, num_inner_epochs=1,
                                   resume_from=str(ckpt)))
    assert resumed.iteration == 1
    resumed.fit()
    assert_resumed_equals_straight(straight, resumed)


def test_one_raft_iteration_trains_a_tiny_video_pipeline(tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = tiny_video(_raft_config("wan", tmp_path, tiny_pipeline_dir, num_inner_epochs=1))
    cfg.sample.group_size, cfg.sample.batch_size = 2, 4
    trainer = Trainer(cfg)
    metrics = train_one_iteration(trainer)
    assert metrics["raft/winners"] == 2.0 and math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert trainer.last_images.shape == (4, 9, 3, 32, 32)


@pytest.mark.slow
def test_two_process_raft_equals_one_process(tmp_path, tiny_pipeline_dir):
    """accelerate on CPU with 2 gloo processes (each holding whole groups, so its own winners) and the same global
    batch: the same rewards, winner count, gradient norm and weights as one process."""
    cfg = _raft_dict("sd3", tmp_path / "dp2", tiny_pipeline_dir, num_inner_epochs=1)
    one, two = one_and_two_process_runs(cfg, tmp_path)
    h1, h2 = one.history[0], two["history"][0]
    assert h1["raft/winners"] == h2["raft/winners"] == 4.0  # the best of each of the 4 groups, over both processes
    # the logged loss is process 0's own (half the batch): unequal, so the work was really split in two
    assert h2["train/loss"] != pytest.approx(h1["train/loss"], rel=1e-6, abs=1e-9)
    assert_two_processes_match_one(one, two, cfg["train"]["learning_rate"])
