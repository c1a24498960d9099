"""DanceGRPO's best/worst-k selection (diffusion_rl.selection): equal to a brute-force ranking, the same on 2
processes as on 1, neutral when off, and one GRPO iteration of the `dance_grpo_video` preset on tiny Wan."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl import sample_assignment
from diffusion_rl.config import from_dict
from diffusion_rl.selection import best_worst_indices, best_worst_mask
from mmreward.errors import ConfigError
from tests._helpers.thread_accelerator import ThreadAccelerator, run_threads


def _brute_force(adv: list[float], groups: list[int], k: int) -> set[int]:
    """Positions kept: per group, sort (advantage, position) pairs; the first k and the last k."""
    kept: set[int] = set()
    for g in set(groups):
        ranked = sorted((a, i) for i, (a, gg) in enumerate(zip(adv, groups)) if gg == g)
        if len(ranked) <= 2 * k:
            kept.update(i for _, i in ranked)
        else:
            kept.update(i for _, i in ranked[:k] + ranked[-k:])
    return kept


@pytest.mark.parametrize("k", [1, 2, 3])
def test_mask_equals_brute_force_with_ties_and_interleaved_groups(k):
    gen = torch.Generator().manual_seed(k)
    n = 40
    # rounded values make ties; shuffled group ids make groups non-contiguous; group sizes 4..12
    adv = (torch.randn(n, generator=gen) * 2).round() / 2
    groups = torch.repeat_interleave(torch.arange(5), torch.tensor([4, 6, 8, 10, 12]))[torch.randperm(n, generator=gen)]
    mask = best_worst_mask(adv, groups, k)
    assert set(mask.nonzero().flatten().tolist()) == _brute_force(adv.tolist(), groups.tolist(), k)


def test_mask_off_small_groups_and_bad_input():
    adv, groups = torch.tensor([0.3, -1.0, 2.0, 0.1]), torch.tensor([0, 0, 1, 1])
    assert best_worst_mask(adv, groups, 0).all()
    assert best_worst_mask(adv, groups, 1).all()  # groups of 2 <= 2k keep everything
    with pytest.raises(ConfigError, match="k >= 0"):
        best_worst_mask(adv, groups, -1)
    with pytest.raises(ConfigError, match="one shape"):
        best_worst_mask(adv, groups[:3], 1)


def _run_processes(world: int, prompts: int, group: int, adv_table: torch.Tensor, k: int) -> list[set[int]]:
    """Canonical keys (slot * group + sample) each process keeps."""

    def work(acc: ThreadAccelerator) -> set[int]:
        slots, sample_ids = sample_assignment.local_samples(prompts, group, acc.process_index, world)
        order = sample_assignment.CanonicalOrder(acc, slots, sample_ids, group)
        local_adv = adv_table[slots, sample_ids]
        idx = best_worst_indices(local_adv, slots, order, k)
        assert torch.equal(idx, idx.sort().values)  # ascending: local groups stay contiguous
        return set((slots[idx] * group + sample_ids[idx]).tolist())

    return run_threads(world, work)


def test_two_processes_select_on_the_gathered_groups_like_one_process():
    prompts, group, k = 4, 6, 2
    adv_table = torch.randn(prompts, group, generator=torch.Generator().manual_seed(0))
    adv_table[1] = 0.0  # a zero-variance group still keeps 2k samples (the first k and the last k)
    expected = _brute_force(adv_table.flatten().tolist(), torch.arange(prompts).repeat_interleave(group).tolist(), k)
    (one,) = _run_processes(1, prompts, group, adv_table, k)
    two = _run_processes(2, prompts, group, adv_table, k)
    assert one == expected
    assert two[0] | two[1] == expected and not two[0] & two[1]
    # every process keeps exactly 2k of each of its groups
    assert len(two[0]) == len(two[1]) == 2 * k * prompts // 2


def test_config_key_is_checked():
    mock = {"reward": {"rewards": {"mock": 1.0}}}
    assert from_dict(mock).ppo.best_worst_k == 0  # off by default: today's update
    with pytest.raises(ConfigError, match="ppo.best_worst_k must be >= 0"):
        from_dict({"ppo": {"best_worst_k": -1}, **mock})
    with pytest.raises(ConfigError, match="ppo.best_worst_k"):
        from_dict({"ppo": {"best_worst_k": 1.5}, **mock})
    with pytest.raises(ConfigError, match=r"2k = 10 samples of each group, more than sample.group_size \(8\)"):
        from_dict({"ppo": {"best_worst_k": 5}, "sample": {"group_size": 8}, **mock})
    with pytest.raises(ConfigError, match="ppo.best_worst_k is read by grpo, grpo_guard and pref_grpo, not by "
                                          "train.algorithm ddpo"):
        from_dict({"preset": "ddpo", "ppo": {"best_worst_k": 1}, **mock})
    with pytest.raises(ConfigError, match="train.best_worst_k moved to ppo.best_worst_k"):
        from_dict({"train": {"best_worst_k": 1}, **mock})


def test_dance_grpo_video_preset_has_dancegrpos_hunyuanvideo_settings():
    cfg = from_dict({"preset": "dance_grpo_video", "reward": {"rewards": {"videoalign": 1.0}}})
    s, t = cfg.sample, cfg.train
    assert (s.kernel, s.noise_level, s.num_steps, s.group_size, s.share_initial_noise) == ("dance_sde", 0.25, 16, 24, True)
    assert (cfg.ppo.best_worst_k, t.timestep_fraction, t.timestep_selection, t.learning_rate) == (4, 0.6, "random", 1e-5)
    assert (cfg.advantage.unbiased, cfg.advantage.eps, cfg.reward.aggregation) == (True, 1e-8, "advantage")
    assert (cfg.model.lora, cfg.model.gradient_checkpointing, cfg.model.height) == (False, True, 480)


# ------------------------------------------------------------------------------------------------
# the trainer on the tiny Wan pipeline
# ------------------------------------------------------------------------------------------------
H = W = 32
PROMPTS = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def wan_dir(tiny_pipeline_dir):
    """The session's tiny Wan pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("wan"))


def _video_cfg(pipe_dir: str, out, best_worst_k: int, **train) -> dict:
    return {
        "preset": "dance_grpo_video",
        "model": {"pretrained": pipe_dir, "height": H, "width": W, "max_sequence_length": 16},
        "sample": {"num_steps": 2, "group_size": 4, "prompts_per_iteration": 2, "batch_size": 8},
        "train": {"iterations": 1, "learning_rate": 1e-3, "probe": "error", "micro_batch_size": 8, **train},
        "ppo": {"best_worst_k": best_worst_k},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


def test_one_dance_grpo_video_iteration_trains_only_the_best_and_worst(wan_dir, tmp_path):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_video_cfg(wan_dir, tmp_path, best_worst_k=1)))
    assert trainer.cfg.sample.kernel == "dance_sde" and trainer.cfg.sample.share_initial_noise
    seen: dict = {}
    real_update, real_adv = trainer.update, trainer.algorithm.advantages

    def advantages(samples):
        adv, metrics = real_adv(samples)
        seen["all"] = (adv.clone(), samples.batch.slots.clone())
        return adv, metrics

    def update(batch):
        seen["trained"] = (batch.advantages.clone(), batch.slots.clone(), batch.traj.sample_ids.clone())
        return real_update(batch)

    trainer.algorithm.advantages, trainer.update = advantages, update
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    all_adv, all_slots = seen["all"]
    adv, slots, _ = seen["trained"]
    assert len(adv) == 2 * 1 * 2  # 2 prompts x (1 best + 1 worst)
    for s in all_slots.unique():
        group = all_adv[all_slots == s]
        assert sorted(adv[slots == s].tolist()) == [group.min().item(), group.max().item()]
    assert trainer.last_images.shape[0] == 8  # reporting still sees every sample
    assert metrics["train/grad_norm"] > 0
    assert sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.trainable)) > 0


def test_selection_off_and_keep_all_give_bit_identical_updates(wan_dir, tmp_path):
    """k = 0 hands the batch to the update untouched; k = group_size / 2 keeps every sample through the
    selection path, so both runs must end with the same weights bit for bit."""
    from diffusion_rl.trainer import Trainer

    weights = []
    for k in (0, 2):
        trainer = Trainer(from_dict(_video_cfg(wan_dir, tmp_path / f"k{k}", best_worst_k=k)))
        trainer.train_iteration(0)
        weights.append([p.detach().clone() for p in trainer.trainable])
    assert all(torch.equal(a, b) for a, b in zip(*weights))
