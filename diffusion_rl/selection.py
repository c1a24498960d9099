"""DanceGRPO's best/worst-k sample selection: only the k highest- and k lowest-advantage samples of each
prompt group enter the PPO update (`ppo.best_worst_k`; 0 = off, every sample is trained).

The rule, read from DanceGRPO's HunyuanVideo script (fastvideo/train_grpo_hunyuan.py, `--bestofn 8` with
`--num_generations 24`): rewards are normalised within the group first, the per-reward advantages are
weighted (vq_coef * A_vq + mq_coef * A_mq), and the samples are ranked by that weighted advantage; the top
bestofn // 2 and the bottom bestofn // 2 are kept. Each DanceGRPO rank holds one prompt's group, so the
ranking is per group; here k = bestofn // 2 (the preset's 4), ranked per group on the advantages the
algorithm returned (advantage clipping is monotone, so it only matters for ties at +-clip_max).
Selection happens on the gathered canonical-order batch (`CanonicalOrder`), so it does not depend on how
samples are spread over processes. Ties are broken by canonical position (a stable sort): of equal
advantages the earlier sample ranks lower. DanceGRPO then shuffles the kept samples; our minibatches hold
whole groups and accumulate their gradients, so their order does not change the update.
"""

from __future__ import annotations

import dataclasses

import torch

from diffusion_rl.rollout import RolloutBatch
from diffusion_rl.sample_assignment import CanonicalOrder
from mmreward.errors import ConfigError


def best_worst_mask(advantages: torch.Tensor, group_ids: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) bool: True for the k highest and k lowest advantages of each group (all of a group of <= 2k).

    Pure: `advantages` and `group_ids` are (N,) tensors of the whole batch; k = 0 keeps everything."""
    if k < 0:
        raise ConfigError(f"best/worst-k selection needs k >= 0 (0 = off), got {k}")
    if advantages.shape != group_ids.shape or advantages.ndim != 1:
        raise ConfigError(f"advantages and group_ids must be (N,) tensors of one shape, got "
                          f"{tuple(advantages.shape)} and {tuple(group_ids.shape)}")
    keep = torch.zeros(advantages.shape, dtype=torch.bool, device=advantages.device)
    if k == 0:
        return keep.fill_(True)
    for g in torch.unique(group_ids):
        members = (group_ids == g).nonzero().flatten()
        if len(members) <= 2 * k:
            keep[members] = True
            continue
        # stable: ties keep their canonical order, so every process ranks a group identically
        ranked = members[torch.sort(advantages[members], stable=True).indices]
        keep[ranked[:k]] = True
        keep[ranked[-k:]] = True
    return keep


def best_worst_indices(advantages: torch.Tensor, slots: torch.Tensor, order: CanonicalOrder, k: int) -> torch.Tensor:
    """This process's sample indices (ascending, so groups stay contiguous) kept by best/worst-k selection,
    ranked within each group of the gathered batch. Collective: every process must call it."""
    all_adv, all_groups = order.gather(advantages.float()), order.gather(slots)
    keep_local = order.local(best_worst_mask(all_adv, all_groups, k))
    return keep_local.nonzero().flatten().cpu()


def select_best_worst(batch: RolloutBatch, order: CanonicalOrder, k: int) -> RolloutBatch:
    """The batch restricted to the selected samples (the same batch when k = 0: the update is unchanged)."""
    if k == 0:
        return batch
    if batch.advantages is None:
        raise ValueError("best/worst-k selection ranks samples by advantage: compute batch.advantages first")
    idx = best_worst_indices(batch.advantages, batch.slots, order, k)
    return dataclasses.replace(
        batch, traj=batch.traj.index(idx), prompts=[batch.prompts[i] for i in idx.tolist()],
        slots=batch.slots[idx.to(batch.slots.device)], train_steps=batch.train_steps[idx.to(batch.train_steps.device)],
        rewards={name: r[idx.to(r.device)] for name, r in batch.rewards.items()},
        advantages=batch.advantages[idx.to(batch.advantages.device)],
    )
